"""The GNN layers' internals; the public API is jaxsparse_tc.nn."""
