"""L3, autograd: an MLP and a small CNN train-step on the device match CPU eager; PyTorch's
ModuleInfos pass; real transformers models' forward and every gradient match CPU."""

from __future__ import annotations

from ..contracts.clause import Outcome
from .clients import suite_outcome, zoo_outcome
from .levels import TOL, evidence
from .models import autograd_outcome, cnn, mlp
from .subject import StackSubject


@evidence("L3", "mlp", "MLP (Linear-GELU-Linear) forward and backward on the device match CPU eager",
          seam="framework", measured="worst normwise error of output, loss and grads vs CPU",
          relation="<=", limit=TOL["float32"], dtype="float32", shape="x [4, 16] -> 32 -> 8")
def _l3mlp(s: StackSubject) -> Outcome:
    return autograd_outcome(s, mlp, (4, 16), s.config.seed + 30)


@evidence("L3", "cnn", "CNN (Conv2d-ReLU-MaxPool-Linear) forward and backward on the device match "
          "CPU eager", seam="framework",
          measured="worst normwise error of output, loss and grads vs CPU", relation="<=",
          limit=TOL["float32"], dtype="float32", shape="x [2, 3, 8, 8], conv 3->4 k3 p1, pool 2, linear 64->5")
def _l3cnn(s: StackSubject) -> Outcome:
    return autograd_outcome(s, cnn, (2, 3, 8, 8), s.config.seed + 31)


@evidence("L3", "moduleinfo", "PyTorch's ModuleInfo database: forward, backward, .to()/.cpu()/"
          ".to(dtype) keeping parameter identity and ties, state_dict, deepcopy", seam="framework",
          measured="checks passing", relation="==", limit=1.0, dtype="float32",
          shape="module_db inputs (--full: every ModuleInfo)")
def _l3_moduleinfo(s: StackSubject) -> Outcome:
    return suite_outcome(s, "modules")


@evidence("L3", "zoo_backward", "real transformers models (8 architectures) eager forward+backward "
          "on the device match CPU: output, loss and every named gradient", seam="framework",
          measured="models matching CPU", relation="==", limit="all", dtype="float32",
          shape="small configs, random weights")
def _l3zoo_outcome(s: StackSubject) -> Outcome:
    return zoo_outcome(s, ("eager",))
