"""The paper's experiments: a table's sweep of training runs, run in resumable parts
(:mod:`.sweep`), and Tables 2 and 3 rebuilt from the finished runs (:mod:`.rows`, :mod:`.runs`,
:mod:`.noise`, :mod:`.tables`) and written out (:mod:`.output`). The command is
``experiments/tables.py``."""
