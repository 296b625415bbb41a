#!/usr/bin/env bash
# The accelerator measurements of the performance page: parts by importance, within a budget.
#
#   OUT=benchmarks/results/gpu bash benchmarks/lab/gpu_suite.sh [seconds]
#   SMOKE=1 OUT=/tmp/gpu bash benchmarks/lab/gpu_suite.sh      # tiny sizes, to check the script
#   PARTS="run_big_leaf whole_model_mlp" OUT=... bash benchmarks/lab/gpu_suite.sh   # some parts
#
# Runs from the repository root with the checkout on PYTHONPATH (jax with CUDA, optax, flax,
# equinox and pytest installed). Parts run in order of importance; each gets a time limit, and
# a part that would start with too little of the budget (default 540 s) left is skipped. Every
# part writes its JSON and log under $OUT as it finishes (benchmarks.run after every row, so
# a part stopped at its limit keeps the rows it finished). First what the H200's run left
# open (the packed rows, the spread of the rows that timed slower, the NaN payload, the
# GPT, the bf16 rows, the 2000-leaf compile); then second samples.
set -u
OUT=${OUT:-benchmarks/results/gpu}
BUDGET=${1:-540}
PY=${PYTHON:-python}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
START=$(date +%s)
S=${SMOKE:+--smoke}
LEAVES=${SMOKE:+20}

# part NAME LIMIT MIN_LEFT CMD...: run CMD under `timeout LIMIT` if MIN_LEFT seconds remain.
part() {
  local name=$1 limit=$2 need=$3
  shift 3
  if [[ -n ${PARTS:-} && " $PARTS " != *" $name "* ]]; then
    return
  fi
  local left=$((BUDGET - ($(date +%s) - START)))
  if ((left < need)); then
    echo "== $name: skipped ($left s left)" | tee -a "$OUT/summary.txt"
    return
  fi
  ((limit > left)) && limit=$left
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $(($(date +%s) - t0)) s" | tee -a "$OUT/summary.txt"
  tail -n 40 "$OUT/$name.log"
}

# requested NAME: true when PARTS names NAME. Such parts run only on request.
requested() { [[ " ${PARTS:-} " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/device.txt" 2>&1
$PY -c 'import jax, optax; print("jax", jax.__version__, "optax", optax.__version__, jax.devices())' \
  >>"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

# What the H200 has not yet settled, first. Its packed clipped chain stepped in 1.38x
# optax's time and its one-big-leaf rows in 1.18-1.19x (Adam's from the same kernels as
# optax's): the packed rows again, now that statistics are plain dicts, the harness against
# itself on both, the spread those ratios are to be read against, and the host's time per
# step on a step of host work alone (1.44x optax's for the clipped chain on the CPU).
part run_packed 150 60 $PY -m benchmarks.run --only packed --no-training $S --out "$OUT/run_packed.json"
part spread_packed_clip 90 40 $PY -m benchmarks.lab.spread --only packed \
  --config "clip+adamw(cosine, mask)" ${SMOKE:+--reps 1 --rounds 2}
# (the clipped chain, its lean form and the floor of its statistics, beside Adam's step)
part host_overhead 90 40 $PY -m benchmarks.lab.host_overhead $S --config "clip+adamw(cosine, mask)" \
  --config adam --out "$OUT/host_overhead.json"
part spread_big_leaf 90 40 $PY -m benchmarks.lab.spread --only big --config adam ${SMOKE:+--reps 1 --rounds 2}
# The NaN-payload promise on this device.
part nan_payload 60 30 $PY -m pytest -p no:benchmark -p no:cacheprovider -q \
  "tests/layouts/test_packed.py::test_masked_decay_passes_the_unselected_elements_through_bit_for_bit"
# Whole training steps: the GPT-style model (Flax NNX), whose packed row predates views.
part whole_model_gpt 120 60 $PY -m benchmarks.whole_model --only gpt $S --out "$OUT/whole_model_gpt.json"
# The bf16 rows (the H200's last run stopped after three), compile time on 2000 leaves per
# library (one sample each), then the sharded-training example (the single layout).
part run_bf16 150 60 $PY -m benchmarks.run --only bf16 --no-training $S --out "$OUT/run_bf16.json"
part compile_2000 150 60 $PY -m benchmarks.compile_time --leaves ${LEAVES:-2000} --repeat 1 --out "$OUT/compile_time.json"
part train_sharded 60 30 $PY examples/train_sharded.py --layout single ${SMOKE:+--steps 3}
# Second samples of what both GPUs ran. The packed MLP's compile, slow on a GPU before its
# leaves were read through views (2.36x optax's on an H200, 0.50x after): its step taken
# apart (500 leaves), then the whole model (optax's compile of it alone took 69-73 s). The
# runs without autotuning, Triton's GEMMs or the fusion autotuner, which looked for the
# cause on the GPU, run only when PARTS names them.
PROBE=(-m benchmarks.lab.compile_probe ${SMOKE:+--smoke} --only "optax adam, tree"
  --only "tree gradient only" --only "packed gradient only"
  --only "gradtx adam, packed, runtime offsets")
part compile_probe 150 60 $PY "${PROBE[@]}" --out "$OUT/compile_probe.json"
requested compile_probe_no_autotune && part compile_probe_no_autotune 150 60 \
  env XLA_FLAGS="--xla_gpu_autotune_level=0" \
  $PY "${PROBE[@]}" --out "$OUT/compile_probe_no_autotune.json"
requested compile_probe_no_triton && part compile_probe_no_triton 150 60 \
  env XLA_FLAGS="--xla_gpu_enable_triton_gemm=false" \
  $PY "${PROBE[@]}" --out "$OUT/compile_probe_no_triton.json"
requested compile_probe_no_fusion_autotuner && part compile_probe_no_fusion_autotuner 150 60 \
  env XLA_FLAGS="--xla_gpu_experimental_enable_fusion_autotuner=false" \
  $PY "${PROBE[@]}" --out "$OUT/compile_probe_no_fusion_autotuner.json"
part whole_model_mlp 420 120 $PY -m benchmarks.whole_model --only mlp $S --out "$OUT/whole_model_mlp.json"
# The harness against itself on the tree's clipped chain, a host-bound step (1.06x for optax
# against itself, 1.00x for gradtx, on the H200).
part spread_clip 90 40 $PY -m benchmarks.lab.spread --only transformer \
  --config "clip+adamw(cosine, mask)" ${SMOKE:+--reps 1 --rounds 2}
part run_big_leaf 150 60 $PY -m benchmarks.run --only "one big leaf" --no-training $S --out "$OUT/run_big_leaf.json"
part run_transformer 300 60 $PY -m benchmarks.run --only transformer --no-training $S --out "$OUT/run_transformer.json"
# Where the step's time goes: kernels per step, default flags, then command buffers (CUDA
# graphs) for every fusion, then none.
part kernels 90 40 $PY -m benchmarks.lab.kernels $S --out "$OUT/kernels.json"
part kernels_graphs 90 40 env XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1" \
  $PY -m benchmarks.lab.kernels $S --out "$OUT/kernels_graphs.json"
part kernels_no_graphs 90 40 env XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
  $PY -m benchmarks.lab.kernels $S --out "$OUT/kernels_no_graphs.json"
# Last, the combinators around an optimizer (accumulate, apply_if_finite), on large leaves
# and then on 150 small ones (each row is written as it finishes).
part combinators 150 40 $PY -m benchmarks.combinators $S --out "$OUT/combinators.json"
# L-BFGS with its zoom line search on the large leaves (a loop of trials inside the step).
part lbfgs 90 40 $PY -m benchmarks.lbfgs --only large $S --out "$OUT/lbfgs.json"
echo "== total $(($(date +%s) - START)) s" | tee -a "$OUT/summary.txt"
