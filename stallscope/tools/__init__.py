"""Tools beside the monitoring flow: ``pack`` (small files -> WebDataset shards) and the dataset
readers it uses, ``disk`` (SMART health with its state file, and the read benchmark)."""
