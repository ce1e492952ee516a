"""DeepSpeed's entry points: ``add_config_arguments``, ``init_distributed`` and ``initialize``.

``initialize`` reads the config (``args.deepspeed_config``, DeepSpeed's deprecated
``args.deepscale_config``, or ``config=``: a dict or a JSON path; two of them is DeepSpeed's
error), checks it against the job's data-parallel world size, and returns DeepSpeed's 4-tuple
``(engine, optimizer, training_dataloader, lr_scheduler)``: a
:class:`~.pipe_engine.DeepSpeedPipelineEngine` for a ``PipelineModule``, else a
:class:`~.engine.DeepSpeedEngine`.

Example::

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    deepspeed.init_distributed()
    engine, opt, loader, sched = deepspeed.initialize(args=args, model=net,
                                                      model_parameters=net.parameters())
"""

from __future__ import annotations

import argparse
import os
import warnings

from minigrad.distributed.comm.group import (
    get_world_size,
    init_process_group,
    is_distributed,
    is_initialized,
)
from minigrad.distributed.deepspeed.components import build_optimizer
from minigrad.distributed.deepspeed.config import (
    DeepSpeedConfig,
    DeepSpeedConfigError,
    load_config,
)
from minigrad.distributed.deepspeed.engine import DeepSpeedEngine
from minigrad.distributed.deepspeed.pipe_engine import DeepSpeedPipelineEngine
from minigrad.distributed.pipeline.module import PipelineModule

__all__ = ["add_config_arguments", "init_distributed", "initialize"]

#: DeepSpeed's backend names -> minigrad's (None: minigrad chooses)
_BACKENDS = {None: "auto", "gloo": "cpu", "nccl": "nccl", "mpi": "mpi", "ccl": "cpu",
             "hccl": "auto"}


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's arguments to ``parser`` and return it: ``--deepspeed``,
    ``--deepspeed_config PATH`` and the deprecated ``--deepscale``/``--deepscale_config``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed "
                            "backend)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True,
                     distributed_port: int | None = None, verbose: bool = True, timeout=None,
                     init_method: str | None = None, dist_init_required: bool | None = None,
                     config=None, rank: int = -1, world_size: int = -1) -> None:
    """Join the job's process group unless already done: in a process started by a launcher
    (``RANK``/``WORLD_SIZE`` set, or ``rank``/``world_size`` given) with ``dist_backend``
    (``"gloo"``: minigrad's cpu backend, ``"nccl"``, ``"mpi"``; None: minigrad chooses). A process
    started alone stays a single process (nothing to join)."""
    if is_initialized() or dist_init_required is False:
        return
    if dist_backend not in _BACKENDS:
        raise ValueError(f"deepspeed.init_distributed: dist_backend must be one of "
                         f"{sorted(k for k in _BACKENDS if k)} or None, got {dist_backend!r}")
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if not launched and world_size < 0:
        return
    port = None if "MASTER_PORT" in os.environ else distributed_port
    init_process_group(port=port, world_size=None if world_size < 0 else world_size,
                       rank=None if rank < 0 else rank, backend=_BACKENDS[dist_backend],
                       timeout=timeout, init_method=init_method)


def _config_source(args, config):
    """Where the config comes from, with DeepSpeed's rules on the deprecated spelling and on
    being given two configs."""
    if args is not None and getattr(args, "deepscale_config", None) is not None:
        warnings.warn("--deepscale_config is deprecated, please use --deepspeed_config",
                      DeprecationWarning, stacklevel=3)
        if getattr(args, "deepspeed_config", None) is not None:
            raise DeepSpeedConfigError(
                "deepspeed.initialize: not sure how to proceed, we were given both a "
                "deepscale_config and deepspeed_config")
        args.deepspeed_config, args.deepscale_config = args.deepscale_config, None
    from_args = None if args is None else getattr(args, "deepspeed_config", None)
    if from_args is not None:
        if config is not None:
            raise DeepSpeedConfigError(
                "deepspeed.initialize: not sure how to proceed, we were given deepspeed configs "
                "in the deepspeed arguments (args.deepspeed_config) and deepspeed.initialize() "
                "function call (config=)")
        return from_args
    if config is None:
        raise DeepSpeedConfigError(
            "deepspeed.initialize: DeepSpeed requires --deepspeed_config to specify "
            "configuration file (or config= a dict or a JSON path)")
    return config


def initialize(args=None, model=None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port=None, mpu=None,
               dist_init_required=None, collate_fn=None, config=None, mesh_param=None,
               config_params=None):
    """DeepSpeed's ``initialize``: returns ``(engine, engine.optimizer,
    engine.training_dataloader, engine.lr_scheduler)``; see the module docstring.
    ``config_params`` is DeepSpeed's old name of ``config``. ``mpu`` and ``mesh_param`` (model
    parallelism passed from outside) are not supported: build a ``PipelineModule`` instead."""
    if model is None:
        raise ValueError("deepspeed.initialize: a model is required (model=None)")
    if mpu is not None or mesh_param is not None:
        raise ValueError("deepspeed.initialize: mpu= and mesh_param= are not supported in "
                         "minigrad; pipeline parallelism comes from a PipelineModule")
    if config is None:
        config = config_params
    init_distributed(dist_init_required=dist_init_required)
    raw = load_config(_config_source(args, config))
    if isinstance(model, PipelineModule):
        cfg = DeepSpeedConfig(raw, world_size=model.topology.get_dim("data"))
        if model_parameters is not None:
            model_parameters = list(model_parameters)
        opt = _pipeline_optimizer(cfg, model, optimizer, model_parameters)
        engine = DeepSpeedPipelineEngine(model, opt, cfg, training_data=training_data,
                                         lr_scheduler=lr_scheduler, collate_fn=collate_fn)
    else:
        world = get_world_size() if is_distributed() else 1
        cfg = DeepSpeedConfig(raw, world_size=world)
        engine = DeepSpeedEngine(model, cfg, optimizer=optimizer,
                                 model_parameters=model_parameters, training_data=training_data,
                                 lr_scheduler=lr_scheduler, collate_fn=collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _pipeline_optimizer(cfg: DeepSpeedConfig, model, optimizer, params):
    """The client's optimizer (object or factory) or the config's, over this stage's
    parameters."""
    from_config = cfg.optimizer
    params = list(model.parameters()) if params is None else params
    if optimizer is not None:
        return optimizer(params) if callable(optimizer) and not hasattr(
            optimizer, "param_groups") else optimizer
    if from_config is None:
        raise DeepSpeedConfigError(
            "deepspeed.initialize: no optimizer: pass optimizer= or give the config an "
            "optimizer section ({\"type\": \"Adam\", \"params\": {\"lr\": ...}})")
    return build_optimizer(from_config, params)

