# Forced AVX2: beea14a against the new commits, three alternating fresh bench runs each (ab.sh, named old_avx2_N):
# OLD=<a `git archive beea14a` tree> OUT=<folder> bash ab_avx2.sh
SPECDEC_CPU_ISA=avx2 RUNS=3 TAG=_avx2 exec bash "$(dirname "$(readlink -f "$0")")/ab.sh"
