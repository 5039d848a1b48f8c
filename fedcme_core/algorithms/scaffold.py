"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, ICML 2020): stochastic
controlled averaging, control variates with option II.

    y    <- y - lr * (g(y) + c - c_i)        each local step (the loss stays CE)
    c_i+  = c_i - c + (x - y) / (K * lr)     option II, K local steps
    c    <- c + (|S| / N) * mean_{i in S} (c_i+ - c_i)

x is the global model w^t, y the client's local model, c the server's control variate and c_i
the client's; both are 0 until first computed. The correction -lr * (c - c_i) follows the
optimizer's step (momentum and weight decay act on g alone), as in NIID-Bench's scaffold
(Xtra-Computing/NIID-Bench, ``train_net_scaffold``). The model is averaged as FedAvg's (by
data size; the paper's global step size eta_g = 1). Control variates cover the trainable
parameters, as float32 tensors on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fedcme_core.algorithms.base import AlgorithmState, ClientContext, Upload
from fedcme_core.algorithms.fedavg import FedAvg
from fedcme_core.algorithms.settings import BaseAlgorithmConfig
from fedcme_core.client.hooks import ClientHooks
from fedcme_core.common.lazy import lazy_module

torch = lazy_module("torch")
models = lazy_module("fedcme_core.client.models")

ControlVariate = dict[str, "torch.Tensor"]  # parameter name -> tensor of the parameter's shape


class ScaffoldConfig(BaseAlgorithmConfig):
    name: Literal["scaffold"] = "scaffold"
    display_name = "SCAFFOLD"


@dataclass(frozen=True)
class ScaffoldState(AlgorithmState):
    """The server's control variate c (None before the first aggregation)."""

    control: ControlVariate | None = None


class ControlVariateHooks(ClientHooks):
    """After each optimizer step: y <- y - lr * (c - c_i); counts the steps (K). Holds c and c_i for the report."""

    def __init__(self, model: models.SplitModel, server: ControlVariate, client: ControlVariate, lr: float) -> None:
        self.server, self.client = server, client
        self.parameters = [parameter for _, parameter in model.named_parameters()]
        self.correction = [(server[name] - client[name]).to(parameter.device)
                           for name, parameter in model.named_parameters()]
        self.lr = lr
        self.steps = 0

    def after_step(self) -> None:
        with torch.no_grad():
            for parameter, correction in zip(self.parameters, self.correction):
                parameter.sub_(correction, alpha=self.lr)
        self.steps += 1


def zeros_like_parameters(model: models.SplitModel) -> ControlVariate:
    return {name: torch.zeros_like(parameter, device="cpu") for name, parameter in model.named_parameters()}


def client_control_update(client_control: ControlVariate, server_control: ControlVariate,
                          global_state: Mapping[str, torch.Tensor], local_state: Mapping[str, torch.Tensor],
                          steps: int, lr: float) -> ControlVariate:
    """Option II: c_i+ - c_i = -c + (x - y) / (K * lr), per parameter."""
    return {name: -server_control[name] + (global_state[name].cpu() - local_state[name].cpu()) / (steps * lr)
            for name in client_control}


def server_control_update(server_control: ControlVariate, deltas: Sequence[ControlVariate],
                          num_clients: int) -> ControlVariate:
    """c + (|S| / N) * mean of the deltas = c + sum of the deltas / N."""
    return {name: value + sum(delta[name] for delta in deltas) / num_clients for name, value in server_control.items()}


class Scaffold(FedAvg):
    """Server state: :class:`ScaffoldState` (c); client state: c_i."""

    config_class = ScaffoldConfig
    state_class = ScaffoldState

    def client_hooks(self, model: models.SplitModel, context: ClientContext) -> ClientHooks:
        """c and c_i (zeros before the first aggregation / the client's first round)."""
        zeros = zeros_like_parameters(model)
        server = context.server.control or zeros
        client = context.client_state["control"] if context.client_state is not None else zeros
        return ControlVariateHooks(model, server, client, context.learning_rate)

    def client_update(self, model: models.SplitModel, inputs: torch.Tensor, labels: torch.Tensor,
                      context: ClientContext, hooks: ClientHooks) -> dict[str, Any]:
        local = {name: parameter.detach() for name, parameter in model.named_parameters()}
        delta = client_control_update(hooks.client, hooks.server, context.global_state, local, hooks.steps,
                                      context.learning_rate)
        return {"control_delta": delta}

    def client_state(self, model_state: Mapping[str, torch.Tensor], report: Mapping[str, Any],
                     context: ClientContext) -> dict[str, Any]:
        """c_i+ = c_i + (c_i+ - c_i)."""
        delta = report["control_delta"]
        client = context.client_state["control"] if context.client_state is not None else None
        return {"control": {name: (client[name] if client is not None else 0) + value for name, value in delta.items()}}

    def server_update(self, server: ScaffoldState, uploads: Sequence[Upload], num_clients: int) -> ScaffoldState:
        deltas = [upload.report["control_delta"] for upload in uploads]
        control = server.control or {name: torch.zeros_like(value) for name, value in deltas[0].items()}
        return ScaffoldState(control=server_control_update(control, deltas, num_clients))
