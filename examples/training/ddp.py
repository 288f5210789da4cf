"""Data parallel training (DDP) with a plain numpy model: every rank holds the
whole model and trains on its shard of each batch; after the backward pass the
gradients, flattened into one buffer (DDP's bucket), are averaged with one
all_reduce, so every rank applies the same update.

    netcoll run -n 4 examples/training/ddp.py
    netcoll run -n 4 examples/training/ddp.py --compression fp16 --error-feedback --steps 3000 --batches 1

At the end, rank 0 checks that every rank holds bit-identical parameters and
compares with the same training done on whole batches in one process:

* ``--compression none`` (the default): the parameters equal the single-process
  ones (float64 sums in another order only);
* ``--compression fp16|bf16|int8``: the gradients cross the wire encoded (docs/compression.md),
  so the parameters differ; the check is that the final loss (of the batch after the last
  step) is within ``RTOL`` of the single-process training's, or within ``ATOL`` times the
  first step's loss (a loss that fell a millionfold is below what a codec resolves).
  ``--error-feedback`` adds what the codec dropped of each step's gradient to the next
  step's (:class:`netcoll.feedback.ErrorFeedback`).

``--batches N`` trains on a data set of N batches, over and over (0, the default: a new batch
every step); ``--batches 1`` is full-batch gradient descent, which drives the loss towards 0.
``--losses FILE`` writes the loss of every step (the whole batch's, before the step's update)
as JSON; bench/losscurves.py draws them.
"""

import argparse
import json

import numpy as np
from mlp import NAMES, STEPS, batch, flatten, grads, init_params, loss, shard, train_single_process, unflatten

import netcoll.sync
from netcoll.feedback import ErrorFeedback

LR = 0.1
#: compressed training: the final loss may differ from uncompressed training's by this, relative,
RTOL = 0.05
#: or by this times the first step's loss
ATOL = 1e-6

parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16", "int8"])
parser.add_argument("--error-feedback", action="store_true", help="carry each step's compression error over")
parser.add_argument("--steps", type=int, default=STEPS)
parser.add_argument("--lr", type=float, default=LR)
parser.add_argument("--batches", type=int, default=0, help="a data set of this many batches (0: a new one each step)")
parser.add_argument("--losses", help="write the loss of every step to this JSON file (rank 0)")
args = parser.parse_args()
codec = args.compression


def data(step):
    """The global batch of ``step``: from a data set of ``--batches`` batches, or new."""
    return batch(step % args.batches if args.batches else step)


with netcoll.sync.connect() as comm:  # under `netcoll run`: coordinator, rank, size from the environment
    feedback = ErrorFeedback(codec, rank=comm.rank, world_size=comm.world_size) if args.error_feedback else None
    params = init_params()  # the same seed everywhere: every rank starts from the same model
    losses = []
    for step in range(args.steps):
        losses.append(loss(params, *data(step)))  # the whole batch's: every rank can make it
        x, y = shard(data(step), comm.rank, comm.world_size)
        g = flatten(grads(params, x, y))
        if feedback is not None:
            g = feedback.compensate("grads", g)  # + what the codec dropped last step
        # blocks; the average over ranks = the whole batch's gradient
        g = comm.all_reduce(g, op="avg", compression=codec)
        g = unflatten(g, params)
        for k in NAMES:
            params[k] = params[k] - args.lr * g[k]

    everyone = comm.all_gather(flatten(params))  # row r: rank r's parameters
    if comm.rank == 0:
        assert (everyone == everyone[0]).all(), "ranks disagree"
        alone = train_single_process(args.lr, steps=args.steps, data=data)
        final, reference = loss(unflatten(everyone[0], alone), *data(args.steps)), loss(alone, *data(args.steps))
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(
                {"compression": codec, "error_feedback": args.error_feedback, "lr": args.lr, "batches": args.batches,
                 "ranks": comm.world_size, "loss": losses, "final": final, "reference": reference},
                f,
            )  # fmt: skip
        diff = np.abs(everyone[0] - flatten(alone)).max()
        if codec == "none":
            assert np.allclose(everyone[0], flatten(alone), rtol=1e-9, atol=1e-12), diff
            print(
                f"ddp: {args.steps} steps on {comm.world_size} ranks; parameters identical on every rank; "
                f"max |difference| from single-process training {diff:.1e}"
            )
        else:
            allowed = RTOL * reference + ATOL * losses[0]
            assert abs(final - reference) <= allowed, f"final loss {final:.4g}, uncompressed {reference:.4g}"
            print(
                f"ddp: {args.steps} steps on {comm.world_size} ranks, {codec}"
                f"{' with error feedback' if feedback else ''}; parameters identical on every rank; "
                f"final loss {final:.4g}, uncompressed {reference:.4g} (allowed: {allowed:.2g} apart)"
            )
