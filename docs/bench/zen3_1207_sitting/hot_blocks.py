"""Two GCC assembly listings of q8dot.c (gcc -S, the build's flags): their basic blocks with 8 or more of one
instruction (vpdpbusd, vpmaddubsw), and what those hot blocks hold between them: instructions, stack references.
Usage: python3 hot_blocks.py old.s new.s vpdpbusd"""
import re, sys, collections
def blocks(path, op):
    out = []
    name, cur = None, []
    for l in open(path):
        if re.match(r'^(\.L\w+|[a-z_][\w.]*):', l):
            if cur: out.append((name, cur))
            name, cur = l.split(':')[0], []
        else:
            l = l.strip()
            if l and not l.startswith('.'): cur.append(l)
    out.append((name, cur))
    res = []
    for name, b in out:
        n_op = sum(1 for l in b if l.startswith(op))
        if n_op < 8: continue
        stack = sum(1 for l in b if ('(%rsp)' in l or '(%rbp)' in l))
        res.append((n_op, len(b), stack))
    return res
op = sys.argv[3]
a, b = blocks(sys.argv[1], op), blocks(sys.argv[2], op)
print('blocks', len(a), len(b))
print('total insns in hot blocks', sum(x[1] for x in a), sum(x[1] for x in b))
print('total stack refs', sum(x[2] for x in a), sum(x[2] for x in b))
print('total', op, sum(x[0] for x in a), sum(x[0] for x in b))
print('insns per op', sum(x[1] for x in a) / sum(x[0] for x in a), sum(x[1] for x in b) / sum(x[0] for x in b))
print('stack per op', sum(x[2] for x in a) / sum(x[0] for x in a), sum(x[2] for x in b) / sum(x[0] for x in b))
