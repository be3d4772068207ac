"""Dataset loaders, one module per source format (the public module jaxsparse_tc.datasets
re-exports them)."""
