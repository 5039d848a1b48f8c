"""Data: the registry of data sources (``catalog``: the official datasets from their offline mirror,
synthetic data, a researcher's npz or image folder), the datasets as tensors, the clients'
partitions and their files, and augmentation. Imports only ``fedcme_core.common``."""
