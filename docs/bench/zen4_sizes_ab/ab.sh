# One target priced per pass size (deded4c) against one scale (beea14a), alternating fresh bench runs:
# OLD=<a `git archive beea14a` tree> OUT=<folder> [RUNS=4] [TAG=_avx2] bash ab.sh (ab_avx2.sh: the forced AVX2 runs)
OUT=${OUT:-/tmp}
cd /tmp
run() { # $1 name $2 pythonpath
  PYTHONPATH=$2 /work/main/.venv/bin/python -c "import sys; from specdec.cli.main import main; sys.argv[0]='specdec'; sys.exit(main())" bench --gammas "" --no-hf --output "$OUT"/ab_$1.json > "$OUT"/ab_$1.log 2>&1 || echo "fail $1"
  python3 -c "
import json; d=json.load(open('"$OUT"/ab_$1.json')); r={x['config']:x for x in d['rows']}
print('$1', r['target-only']['tokens_per_s'], r['adaptive']['tokens_per_s'], round(r['adaptive']['tokens_per_s']/r['target-only']['tokens_per_s'],3), r['adaptive']['alpha'], r['adaptive']['identical_to_target_only'], d['adaptive_gammas'])"
}
for i in $(seq "${RUNS:-4}"); do run old${TAG}_$i "$OLD"; run new${TAG}_$i /work/main; done
