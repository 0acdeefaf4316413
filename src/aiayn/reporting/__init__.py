"""What a run reached and cost, in the paper's figures: FLOPs, the run summary, the experiment
loggers, and the paper's tables rebuilt from finished runs."""
