"""Time per sample of local training, for fmnist_cnn and cifar_cnn: plain PyTorch against
channels_last, torch.compile, and several clients at once with torch.func.

All variants run SGD with momentum and weight decay (the project's local-training settings),
batch 64, cross-entropy, on random tensors of the dataset's shape, one torch thread:

* plain:          one model, `steps` optimizer steps;
* channels_last:  the model and its (pre-converted) inputs in torch.channels_last;
* channels_last_bf16: the same under bf16 autocast of the forward pass and the loss (weights and
                  optimizer fp32, as ``training.precision: bf16``); ``native_bf16`` records whether
                  the CPU computes bf16 natively (AVX512-BF16 or AMX) or oneDNN emulates it;
* compile:        ``torch.compile(model)`` (backend `--compile-backend`, inductor by default;
                  quick mode: eager, i.e. Dynamo tracing without code generation). Its compile
                  time (first step of a fresh compiled model minus a plain step; also a second fresh instance's first step, i.e. whether each
                  client pays it again) is reported, and the per-sample time amortised over
                  `--amortise-steps` steps: (compile + N x step) / (N x batch);
* clients_vmap:   C clients (`--clients`) trained at once: parameters stacked
                  (``torch.func.stack_module_state``), ``vmap(grad_and_value(functional_call
                  ...))`` gives every client's gradient on its own batch, and one SGD step on the
                  stacked tensors is exactly one step per client (SGD is elementwise);
* clients_serial: the same C clients one after another (each `steps` steps, own optimizer).

Numerical equality: the maximum absolute difference of the parameters after `steps` steps
from the same initial weights and batches: channels_last, channels_last_bf16 and compile against plain,
clients_vmap against clients_serial. Variants interleaved, medians of repeats. Quick mode: 2 steps,
2 clients, 1 repeat, no untimed warm-up.

    .venv/bin/python bench/per_sample.py [--models fmnist_cnn,cifar_cnn] [--steps 40] [--clients 4] [--quick]
"""

from __future__ import annotations

import copy
import time

import common
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, stack_module_state, vmap

from fedcme_core.client.compute import native_bf16
from fedcme_core.config.schema import TrainingConfig
from fedcme_core.client.models import MODEL_INPUT_SHAPES, build_model

CONFIG = TrainingConfig()  # lr 0.01, momentum 0.9, weight decay 1e-5


def optimizer_for(parameters) -> torch.optim.SGD:
    return torch.optim.SGD(parameters, lr=CONFIG.lr, momentum=CONFIG.momentum, weight_decay=CONFIG.weight_decay)


def train_steps(model, inputs, labels, optimizer=None, bf16: bool = False) -> torch.optim.SGD:
    """One SGD step per batch: inputs [S, B, C_in, H, W], labels [S, B]; `bf16`: autocast forward and loss."""
    optimizer = optimizer or optimizer_for(model.parameters())
    model.train()
    for batch_inputs, batch_labels in zip(inputs, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(batch_inputs), batch_labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return optimizer


class StackedClients:
    """C models of one architecture trained at once with torch.func over stacked parameters."""

    def __init__(self, models) -> None:
        params, buffers = stack_module_state(models)
        self.params = {name: value.detach() for name, value in params.items()}  # [C, ...] leaves
        self.buffers = buffers
        self.base = copy.deepcopy(models[0]).to("meta")
        self.optimizer = optimizer_for(list(self.params.values()))

        def loss(params, buffers, inputs, labels):
            return F.cross_entropy(functional_call(self.base, (params, buffers), (inputs,)), labels)

        self.step_gradients = vmap(grad_and_value(loss))

    def train_steps(self, inputs, labels) -> None:
        """inputs [C, S, B, C_in, H, W], labels [C, S, B]: one optimizer step per client per batch."""
        for step in range(inputs.shape[1]):
            gradients, _ = self.step_gradients(self.params, self.buffers, inputs[:, step], labels[:, step])
            for name, parameter in self.params.items():
                parameter.grad = gradients[name]
            self.optimizer.step()


def max_abs_diff(first: dict, second: dict) -> float:
    return max(float((first[name].float() - second[name].float()).abs().max()) for name in first)


def parameters_of(model) -> dict:
    return {name: value.detach().clone() for name, value in model.named_parameters()}


def measure(model_name: str, steps: int, batch: int, clients: int, repeats: int, backend: str, amortise: int,
            warmup: int = 1) -> dict:
    generator = torch.Generator().manual_seed(0)
    shape = MODEL_INPUT_SHAPES[model_name]
    inputs = torch.randn(clients, steps, batch, *shape, generator=generator)
    labels = torch.randint(10, (clients, steps, batch), generator=generator)
    channels_last_inputs = torch.stack(
        [torch.stack([x.contiguous(memory_format=torch.channels_last) for x in client]) for client in inputs]
    )
    fresh = lambda client=0: build_model(model_name, seed=client)

    # compile: first step of a fresh compiled model (compilation), then of a second fresh instance
    torch._dynamo.reset()
    compile_error = None
    try:
        first_step = common.timed(lambda: train_steps(torch.compile(fresh(), backend=backend), inputs[0, :1], labels[0, :1]))
        second_step = common.timed(lambda: train_steps(torch.compile(fresh(), backend=backend), inputs[0, :1], labels[0, :1]))
    except Exception as error:  # noqa: BLE001 - e.g. no C++ compiler for inductor: report, keep the other variants
        compile_error = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        first_step = second_step = None

    def plain():
        train_steps(fresh(), inputs[0], labels[0])

    def channels_last():
        train_steps(fresh().to(memory_format=torch.channels_last), channels_last_inputs[0], labels[0])

    def channels_last_bf16():
        train_steps(fresh().to(memory_format=torch.channels_last), channels_last_inputs[0], labels[0], bf16=True)

    compiled_model = torch.compile(fresh(), backend=backend) if compile_error is None else None

    def compiled():
        with torch.no_grad():  # same starting weights every repeat, without recompiling
            for target, source in zip(compiled_model.parameters(), fresh().parameters()):
                target.copy_(source)
        train_steps(compiled_model, inputs[0], labels[0])

    def clients_serial():
        for client in range(clients):
            train_steps(fresh(client), inputs[client], labels[client])

    def clients_vmap():
        StackedClients([fresh(client) for client in range(clients)]).train_steps(inputs, labels)

    variants = {"plain": plain, "channels_last": channels_last, "channels_last_bf16": channels_last_bf16,
                "clients_serial": clients_serial, "clients_vmap": clients_vmap}
    if compiled_model is not None:
        variants["compile"] = compiled
    seconds = common.interleaved(variants, repeats, warmup)
    samples = {name: steps * batch * (clients if name.startswith("clients") else 1) for name in variants}
    per_sample_us = {name: common.median(values) / samples[name] * 1e6 for name, values in seconds.items()}

    # numerical equality after `steps` steps from the same weights and batches
    reference = fresh()
    train_steps(reference, inputs[0], labels[0])
    reference_params = parameters_of(reference)
    other = fresh().to(memory_format=torch.channels_last)
    train_steps(other, channels_last_inputs[0], labels[0])
    diffs = {"channels_last_vs_plain": max_abs_diff(parameters_of(other), reference_params)}
    other = fresh().to(memory_format=torch.channels_last)
    train_steps(other, channels_last_inputs[0], labels[0], bf16=True)
    diffs["channels_last_bf16_vs_plain"] = max_abs_diff(parameters_of(other), reference_params)
    if compile_error is None:
        other = fresh()
        train_steps(torch.compile(other, backend=backend), inputs[0], labels[0])
        diffs["compile_vs_plain"] = max_abs_diff(parameters_of(other), reference_params)
    serial_models = [fresh(client) for client in range(clients)]
    for client, model in enumerate(serial_models):
        train_steps(model, inputs[client], labels[client])
    stacked = StackedClients([fresh(client) for client in range(clients)])
    stacked.train_steps(inputs, labels)
    diffs["clients_vmap_vs_serial"] = max(
        max_abs_diff({name: stacked.params[name][client] for name in stacked.params}, parameters_of(model))
        for client, model in enumerate(serial_models)
    )

    record = {
        "model": model_name,
        "batch_size": batch,
        "steps": steps,
        "clients": clients,
        "repeats": repeats,
        "warmup": warmup,
        "threads": torch.get_num_threads(),
        "native_bf16": native_bf16(torch.device("cpu")),
        "per_sample_us": common.rounded(per_sample_us, 2),
        "samples_per_second": {name: round(1e6 / value, 1) for name, value in per_sample_us.items()},
        "ratio_vs_plain": {name: common.ratio(per_sample_us["plain"], value) for name, value in per_sample_us.items()},
        "ratio_clients_vmap_vs_serial": common.ratio(per_sample_us["clients_serial"], per_sample_us["clients_vmap"]),
        "max_abs_param_diff": {name: float(f"{value:.3e}") for name, value in diffs.items()},
        "compile": {"backend": backend, "error": compile_error},
    }
    if compile_error is None:
        step_seconds = per_sample_us["compile"] * batch / 1e6
        plain_step = per_sample_us["plain"] * batch / 1e6
        compile_seconds = max(first_step - plain_step, 0.0)
        amortised = (compile_seconds + amortise * step_seconds) / (amortise * batch) * 1e6
        record["compile"].update({
            "compile_seconds": round(compile_seconds, 3),
            "second_instance_first_step_seconds": round(second_step, 3),
            "amortise_steps": amortise,
            "amortised_per_sample_us": round(amortised, 2),
            "ratio_amortised_vs_plain": common.ratio(per_sample_us["plain"], amortised),
        })
    return record


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--models", default="fmnist_cnn,cifar_cnn")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per timed run (per client)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--clients", type=int, default=None, help="clients trained at once (vmap)")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; quick: eager)")
    parser.add_argument("--amortise-steps", type=int, default=1000,
                        help="steps over which compile time is amortised (about a 2-epoch client round on 2 cores x 10 rounds)")
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    steps = arguments.steps or (2 if arguments.quick else 40)
    clients = arguments.clients or (2 if arguments.quick else 4)
    repeats = arguments.repeats or (1 if arguments.quick else 5)
    backend = arguments.compile_backend or ("eager" if arguments.quick else "inductor")
    warmup = 0 if arguments.quick else 1  # quick: the timed run is the first (figures meaningless anyway)
    for model_name in [name.strip() for name in arguments.models.split(",") if name.strip()]:
        if model_name not in MODEL_INPUT_SHAPES:
            parser.error(f"unknown model {model_name!r}")
        started = time.perf_counter()
        record = measure(model_name, steps, arguments.batch_size, clients, repeats, backend, arguments.amortise_steps, warmup)
        record["bench_seconds"] = round(time.perf_counter() - started, 1)
        common.emit("per_sample", record, arguments.results, quick=arguments.quick)


if __name__ == "__main__":
    main()
