"""Runnable examples: `python -m jaxsparse_tc.examples.train --model gcn`."""
