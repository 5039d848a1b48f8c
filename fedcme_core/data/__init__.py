"""Data: the offline dataset sources, the datasets as tensors, the clients' partitions and
their files, and augmentation. Imports only ``fedcme_core.common``."""
