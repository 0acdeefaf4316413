"""What a run reached and cost, in the paper's figures: FLOPs, the run summary and the experiment
loggers. The paper's tables, rebuilt from many runs, are :mod:`aiayn.tables`."""
