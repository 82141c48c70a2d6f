"""Samples of `perf script -F comm,tid,ip,sym` output: each a list, its header line first, then
its frames' symbols leaf first. Shared by alloc_callers.py and incl.py."""


def load(path):
    stacks, cur = [], []
    for line in open(path):
        line = line.rstrip('\n')
        if not line.strip():
            if cur:
                stacks.append(cur)
            cur = []
            continue
        if not line.startswith('\t') and not line.startswith(' '):
            cur = [line]
            continue
        parts = line.strip().split(' ', 1)
        cur.append(parts[1] if len(parts) > 1 else parts[0])
    if cur:
        stacks.append(cur)
    return stacks
