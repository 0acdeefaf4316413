"""The paper's tables as experiments: their rows (from conf/experiment/), the runs that measured
them, and the tables rebuilt from those runs (markdown, CSV, charts, W&B Tables)."""
