"""Internals: the primitives and their rules, lowering, the format builder. Not a public API."""
