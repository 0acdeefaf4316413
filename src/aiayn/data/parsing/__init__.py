"""English constituency parsing (§6.3): reading the WSJ treebank (``treebank``), trees as token
sequences and back (``linearize``) and the data module (``datamodule``).
"""
