"""Sums ncu --csv gpu__time_duration per kernel name (stdin); prints the top kernels."""
import sys, csv, collections
rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith('"'))]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
agg = collections.defaultdict(lambda: [0.0, 0])
for r in rows:
  v = float(r[vi].replace(",", "")); v = v / 1e3 if r[ui] == "nsecond" else v * (1e3 if r[ui] == "msecond" else 1)
  a = agg[r[ki][:100]]; a[0] += v; a[1] += 1
tot = sum(a[0] for a in agg.values())
print(f"total {tot:.1f} us, {sum(a[1] for a in agg.values())} kernels")
for k, (t, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:14]:
  print(f"{t:9.1f} us {n:3d}x  {k}")
