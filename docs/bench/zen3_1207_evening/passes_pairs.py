"""kernel-ab's whole passes with one-row pairs forced on in both builds."""
import sys
from specdec import weights
from specdec.engine.models import load_model
from specdec.tools.bench.kernel_ab import Builds, pass_rows
a, b = sys.argv[1].split(","); sizes = [int(s) for s in sys.argv[2].split(",")]; reps = int(sys.argv[3])
loaded = load_model(weights.resolve("packaged:target"), "cpu", dtype="gguf-q8")
builds = Builds(loaded.runner, [a, b], True)
print("one-row pairs:", builds.one_row_pairs)
for row in pass_rows(loaded, builds, sizes, reps):
    print(f"pass S={row['rows']:2}  A {row['a_ms']:8.2f}  B {row['b_ms']:8.2f}  B/A {row['b_over_a']:.3f}", flush=True)
