"""Data: readers, download, preprocessing, splits, prepared datasets, batches."""
