"""Reading GPU buffers back in the GPU tests."""
import numpy as np


def run_read(dev, dispatches, t: int, buf, nbytes: int) -> np.ndarray:
    """The first nbytes of buf (a copy source) after dispatches ran at t (none: as the
    submissions so far left it), as bytes."""
    stage = dev.staging(nbytes)
    enc = dev.record(dispatches, t)
    enc.copy_buffer_to_buffer(buf, 0, stage, 0, nbytes)
    dev.queue.submit([enc.finish()])
    return dev.read(stage, nbytes)
