"""The fs tier's record files in C (``fs_files``, from ``fs_files.c``, compiled on first use):
one call writes a bucket's records under its lock or reads a batch, with the GIL released."""
