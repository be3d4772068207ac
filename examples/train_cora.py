"""Train a GNN on Cora: a thin wrapper of `python -m jaxsparse_tc.examples.train`.

python examples/train_cora.py --model gcn            # or gat, agnn, gt
python examples/train_cora.py --model gat --framework equinox --seeds 5 --quiet
"""

from jaxsparse_tc.examples.train import main

if __name__ == "__main__":
  raise SystemExit(main())
