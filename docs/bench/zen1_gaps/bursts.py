import sys, statistics
from collections import Counter
lines=[l.split() for l in open(sys.argv[1])]
# bursts start at a pass whose tok >= 40 with rows>=5 (the prompts' prefill pass)
idx=[i for i,l in enumerate(lines) if l[0]=='pass' and int(l[5])>=40 and int(l[3])>=5 and (i==0 or not (lines[i-2][0]=='pass' and int(lines[i-2][5])>=40))]
# merge consecutive prefill passes
starts=[]
for i in idx:
    if not starts or i-starts[-1]>40: starts.append(i)
starts.append(len(lines))
for a,b in zip(starts,starts[1:]):
    seg=lines[a:b]
    passes=[l for l in seg if l[0]=='pass']
    rows=[int(p[3]) for p in passes]
    t=float(passes[-1][1])-float(passes[0][1])
    misses=sum(1 for p in passes if int(p[3])==int(p[9]) and len(p)>12 and int(p[3])<8)
    gaps=sorted(float(l[4]) for l in seg if l[0]=='enter' and float(l[4])>0)
    print(f"passes {len(passes)} rows {sum(rows)} mean {sum(rows)/len(passes):.2f} span {t:.2f}s waited {statistics.mean(float(p[7]) for p in passes):.2f} gap p50 {gaps[len(gaps)//2]:.1f} p90 {gaps[int(.9*len(gaps))]:.1f} missed-with-away {misses} {sorted(Counter(rows).items())}")
