"""perf script output (argv[1]) -> the share of samples with each later argument in their stack."""
import collections, os, re, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_stacks import load
stacks = load(sys.argv[1])
total=len(stacks)
for fn in sys.argv[2:]:
    n=sum(1 for s in stacks if any(fn in f for f in s[1:]))
    print(f"{n/total*100:5.1f}%  {fn}")
