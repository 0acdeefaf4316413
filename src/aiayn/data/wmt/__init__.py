"""WMT 2014 English-German and English-French (§5.1): the raw archives and their files
(``archives``), cleaning (``cleaning``), the sgm test sets (``sgm``), preparation once
(``preparation``), binarised storage (``storage``) and the data module (``datamodule``).
"""
