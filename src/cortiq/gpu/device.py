"""The GPU behind `device="gpu"`: a WebGPU adapter through the `wgpu` package
(wgpu-native: Vulkan, Metal or DX12), its limits, and what every forward needs from it
(buffers, shader modules, pipelines, the one readback of a submission).

One `Device` per process is shared by every GPU model (`Device.get()`); it asks the
adapter for its own storage-buffer and workgroup limits instead of WebGPU's defaults,
so large matrices are split only where the hardware requires it.
"""
from __future__ import annotations

import logging
import os
import threading
from importlib import resources
from types import SimpleNamespace

import numpy as np

from ..kernels._config import env
from ..errors import ConfigError, CortiqError

log = logging.getLogger("cortiq.gpu")

DEVICES = ("cpu", "gpu", "auto")
#: limits asked of the adapter (its own values, not WebGPU's defaults)
_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size",
           "max-storage-buffers-per-shader-stage", "max-compute-workgroup-storage-size",
           "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x")


def import_wgpu():
    """The wgpu module, or ConfigError saying how to install it."""
    try:
        import wgpu
    except ImportError as e:
        raise ConfigError("device='gpu' needs the wgpu package (WebGPU through Vulkan, "
                          f"Metal or DX12): pip install 'cortiq[gpu]' ({e})") from None
    return wgpu


def _request_adapter(wgpu):
    # The loader prints to stderr when XDG_RUNTIME_DIR is unset on headless machines;
    # it is irrelevant for compute.
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        return wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # noqa: BLE001 -- wgpu raises bare RuntimeError-likes when no driver exists
        log.debug("no WebGPU adapter: %s", e)
        return None


def adapters() -> list[dict]:
    """Every adapter wgpu can see, as {device, vendor, backend, type, description}
    (empty when wgpu is missing or no driver answers)."""
    try:
        import wgpu
    except ImportError:
        return []
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        found = wgpu.gpu.enumerate_adapters_sync()
    except Exception:  # noqa: BLE001 -- any loader failure means: no adapters to list
        return []
    out = []
    for a in found:
        i = a.info
        out.append({"device": i.get("device", ""), "vendor": i.get("vendor", ""),
                    "backend": i.get("backend_type", ""), "type": i.get("adapter_type", ""),
                    "description": i.get("description", "")})
    return out


def adapter_lines() -> list[str]:
    """The lines cortiq.show_config prints about the GPU adapters wgpu can see."""
    found = adapters()
    lines = [(f"  gpu adapters: {len(found) or 'none'}  (LLM(device='gpu'), CORTIQ_DEVICE; "
              "needs the wgpu package: cortiq[gpu])")]
    lines += [f"    {a['device']} ({a['backend']}, {a['type']})" for a in found]
    return lines


def resolve_device(device) -> str:
    """"cpu" or "gpu" for LLM(device=...): None reads CORTIQ_DEVICE (default "cpu");
    "auto" takes a hardware GPU when one answers, else the CPU with one log line
    (a software adapter such as llvmpipe is slower than cortiq's own CPU kernels)."""
    if device is None:
        device = (env("CORTIQ_DEVICE") or "").strip().lower() or "cpu"
    if device not in DEVICES:
        raise ConfigError(f"device: expected one of {', '.join(DEVICES)}, got {device!r}")
    if device != "auto":
        return device
    try:
        dev = Device.get()
    except ConfigError as e:
        log.info("device='auto': running on the CPU (%s)", e)
        return "cpu"
    if dev.software:
        log.info("device='auto': running on the CPU (the only GPU adapter is the software "
                 "renderer %s)", dev.name)
        return "cpu"
    return "gpu"


def subgroups_setting() -> bool | None:
    """CORTIQ_GPU_SUBGROUPS: 1/on reduces the decode matvec's rows with subgroupAdd where
    the adapter offers subgroups, 0/off also keeps the device from asking for them;
    unset (None): the device asks for them where offered and the decode matvec keeps
    its shared-memory tree, which measured faster on an H100 (docs/PERFORMANCE.md,
    section 15)."""
    raw = (env("CORTIQ_GPU_SUBGROUPS") or "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"CORTIQ_GPU_SUBGROUPS: expected 1/on or 0/off, got {raw!r}")


_RAW: list = []


def _raw_pass():
    """(set_pipeline, set_bind_group, dispatch, NULL) of wgpu-native's compute-pass
    API as the wgpu package binds it, or None where that module layout differs. The
    plain C entry points, not the package's error-capturing wrappers of them: wgpu
    validates a pass's commands when the encoder finishes (`finish()`, through the
    package's API, raises there), and the wrapper around each call took 40 % of a
    recording (Dory's decode program on the CPU's llvmpipe: 197 against 117 us)."""
    if not _RAW:
        try:
            from wgpu.backends.wgpu_native._api import ffi, lib
            _RAW.append((lib.wgpuComputePassEncoderSetPipeline,
                         lib.wgpuComputePassEncoderSetBindGroup,
                         lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL))
        except (ImportError, AttributeError):
            _RAW.append(None)
    return _RAW[0]


_RAW_SYNC: list = []


def _raw_sync():
    """wgpu-native's submit-for-index, buffer map and indexed poll as the wgpu package
    binds them, or None where that module layout differs. The wgpu package's own
    map_sync waits for every submission made so far (its poll blocks on the newest),
    so a readback of token i would wait for token i + 1 already queued; these wait for
    the submission that wrote the buffer only."""
    if not _RAW_SYNC:
        try:
            from wgpu.backends.wgpu_native._api import ffi, lib, libf
            _RAW_SYNC.append(SimpleNamespace(
                ffi=ffi, submit=libf.wgpuQueueSubmitForIndex, poll=libf.wgpuDevicePoll,
                map=libf.wgpuBufferMapAsync, mapped=libf.wgpuBufferGetConstMappedRange,
                unmap=libf.wgpuBufferUnmap, read_mode=lib.WGPUMapMode_Read,
                ok=lib.WGPUMapAsyncStatus_Success,
                events=lib.WGPUCallbackMode_AllowProcessEvents))
        except (ImportError, AttributeError):
            _RAW_SYNC.append(None)
    return _RAW_SYNC[0]


#: dispatches of a program's first command buffer, and of each later one (`Device.run`):
#: small enough that the device starts soon, large enough that a submission's own cost
#: stays small beside the recording it lets overlap
RUN_FIRST, RUN_PIECE = 24, 128


class Device:
    """A wgpu device and the caches built on it."""

    _shared: Device | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Device:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def __init__(self):
        wgpu = import_wgpu()
        self.wgpu = wgpu
        adapter = _request_adapter(wgpu)
        if adapter is None:
            raise ConfigError("device='gpu': no GPU adapter found (no Vulkan, Metal or DX12 "
                              "driver answered; on Linux install the vendor's Vulkan driver, "
                              "or mesa-vulkan-drivers for the software one)")
        self.adapter = adapter
        info = adapter.info
        self.name = info.get("device", "?")
        self.backend = info.get("backend_type", "?")
        self.software = str(info.get("adapter_type", "")).lower() == "cpu"
        have = dict(adapter.limits)
        want = {k: have[k] for k in _LIMITS if k in have}
        #: whether shaders may use subgroup operations (the decode matvec's reduction)
        self.subgroups = "subgroup" in adapter.features and subgroups_setting() is not False
        try:
            self.dev = adapter.request_device_sync(
                required_limits=want, required_features=["subgroup"] if self.subgroups else [])
        except Exception as e:  # noqa: BLE001 -- wgpu's errors have no common base
            raise ConfigError(f"device='gpu': {self.name} refused a device: {e}") from None
        lim = dict(self.dev.limits)
        self.max_binding = int(lim["max-storage-buffer-binding-size"])
        self.max_buffer = int(lim["max-buffer-size"])
        self.max_storage_buffers = int(lim["max-storage-buffers-per-shader-stage"])
        self.max_workgroup_storage = int(lim["max-compute-workgroup-storage-size"])
        self.uniform_align = int(lim.get("min-uniform-buffer-offset-alignment", 256))
        self.storage_align = int(lim.get("min-storage-buffer-offset-alignment", 256))
        self.queue = self.dev.queue
        self._modules: dict = {}
        self._pipelines: dict = {}
        self._layouts: dict = {}
        log.info("GPU: %s (%s)", self.name, self.backend)

    def __repr__(self):
        return f"Device({self.name!r}, {self.backend})"

    # ---- buffers -----------------------------------------------------------------
    def buffer(self, nbytes: int, *, copy_src=False, copy_dst=True, uniform=False):
        u = self.wgpu.BufferUsage
        usage = (u.UNIFORM if uniform else u.STORAGE)
        if copy_src:
            usage |= u.COPY_SRC
        if copy_dst:
            usage |= u.COPY_DST
        nbytes = max(16, (int(nbytes) + 15) // 16 * 16)
        if nbytes > self.max_buffer or (not uniform and nbytes > self.max_binding):
            raise ConfigError(f"GPU buffer of {nbytes} bytes exceeds {self.name}'s limit "
                              f"({min(self.max_buffer, self.max_binding)} bytes a binding)")
        return self.dev.create_buffer(size=nbytes, usage=usage)

    def upload(self, data, *, uniform=False, pad: int = 16):
        """A buffer holding `data` (bytes or an array), padded to 16 bytes plus `pad`
        (the decoders may read one word past a payload's end)."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1) if not isinstance(
            data, (bytes, bytearray)) else np.frombuffer(bytes(data), np.uint8)
        n = (raw.size + pad + 15) // 16 * 16
        buf = self.buffer(n, uniform=uniform, copy_src=True)
        if raw.size % 4:   # writes come in whole words
            raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
        if raw.size:
            self.queue.write_buffer(buf, 0, raw)
        return buf

    def staging(self, nbytes: int):
        u = self.wgpu.BufferUsage
        return self.dev.create_buffer(size=max(16, (nbytes + 15) // 16 * 16),
                                      usage=u.MAP_READ | u.COPY_DST)

    def submit(self, command_buffers) -> int | None:
        """Submit command buffers; the submission's index (for `read`'s `after`), or
        None where the wgpu package offers no indexed submit."""
        raw = _raw_sync()
        if raw is None:
            self.queue.submit(command_buffers)
            return None
        ffi = raw.ffi
        arr = ffi.new("WGPUCommandBuffer[]", [cb._internal for cb in command_buffers])
        return int(raw.submit(self.queue._internal, len(command_buffers), arr))

    def read(self, staging, nbytes: int, after: int | None = None) -> np.ndarray:
        """The first nbytes of a staging buffer after the submission that filled it;
        with `after` (an index from `submit`), waiting for that submission only, not
        for work queued behind it."""
        size = (nbytes + 15) // 16 * 16 if nbytes else 16
        raw = _raw_sync()
        if after is not None and raw is not None:
            return self._read_after(raw, staging, nbytes, size, after)
        staging.map_sync(self.wgpu.MapMode.READ, 0, size)
        try:    # one copy, out of the mapped memory (read_mapped's own would be a second)
            out = np.frombuffer(staging.read_mapped(0, size, copy=False), np.uint8)
            return out[:nbytes].copy()
        finally:
            staging.unmap()

    def _read_after(self, raw, staging, nbytes: int, size: int, after: int) -> np.ndarray:
        ffi = raw.ffi
        status: list = []

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def mapped(st, _message, _u1, _u2):
            status.append(st)

        info = ffi.new("WGPUBufferMapCallbackInfo *", {"mode": raw.events, "callback": mapped})
        raw.map(staging._internal, raw.read_mode, 0, size, info[0])
        index = ffi.new("WGPUSubmissionIndex *", after)
        raw.poll(self.dev._internal, True, index)
        if not status:      # settled by a later poll: wait for everything submitted
            raw.poll(self.dev._internal, True, ffi.NULL)
        if not status:
            raise CortiqError("GPU readback: the buffer was not mapped after the queue "
                              "drained (device lost?)")
        if status[0] != raw.ok:
            raise CortiqError(f"GPU readback failed (map status {status[0]})")
        try:
            ptr = raw.mapped(staging._internal, 0, size)
            return np.frombuffer(ffi.buffer(ptr, size), np.uint8)[:nbytes].copy()
        finally:
            raw.unmap(staging._internal)

    # ---- shaders and pipelines ---------------------------------------------------
    @staticmethod
    def source(name: str) -> str:
        return resources.files(__package__).joinpath("shaders").joinpath(name).read_text()

    def layout(self, kinds: tuple):
        """A bind-group layout of bindings 0.. of the given kinds ("uniform", "read",
        "rw"), compute stage only."""
        lay = self._layouts.get(kinds)
        if lay is None:
            b = self.wgpu.BufferBindingType
            ty = {"uniform": b.uniform, "read": b.read_only_storage, "rw": b.storage}
            entries = [{"binding": i, "visibility": self.wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": ty[k]}} for i, k in enumerate(kinds)]
            bgl = self.dev.create_bind_group_layout(entries=entries)
            lay = (bgl, self.dev.create_pipeline_layout(bind_group_layouts=[bgl]))
            self._layouts[kinds] = lay
        return lay

    def pipeline(self, key, code: str, kinds: tuple):
        p = self._pipelines.get(key)
        if p is None:
            try:
                mod = self.dev.create_shader_module(code=code)
                p = self.dev.create_compute_pipeline(
                    layout=self.layout(kinds)[1], compute={"module": mod, "entry_point": "main"})
            except Exception as e:  # noqa: BLE001 -- shader compile errors: GPUValidationError et al.
                raise ConfigError(f"GPU shader {key!r} failed to build on {self.name}: {e}") \
                    from None
            self._pipelines[key] = p
        return p

    def record(self, program, t: int = 1):
        """A command encoder holding one compute pass over `program`'s dispatches
        (`kernels.Dispatch`; callable dims are evaluated at t, the chunk's row count or
        the position, as the program defines them; empty dispatches are left out). A
        program's recording is the host's whole per-token cost, so this goes straight to
        wgpu-native's entry points where the wgpu package exposes them (one C call a
        command, set_pipeline skipped when it repeats); otherwise through its API."""
        enc = self.dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        raw = _raw_pass()
        if raw is None:
            for d in program:
                dims = d.dims(t) if callable(d.dims) else d.dims
                if 0 in dims:
                    continue
                cp.set_pipeline(d.pipeline)
                cp.set_bind_group(0, d.group)
                cp.dispatch_workgroups(*dims)
        else:
            set_pipeline, set_group, dispatch, null = raw
            h = cp._internal
            last = None
            for d in program:
                dims = d.dims(t) if callable(d.dims) else d.dims
                if 0 in dims:
                    continue
                p = d.pipeline._internal
                if p is not last:
                    set_pipeline(h, p)
                    last = p
                set_group(h, 0, d.group._internal, 0, null)
                dispatch(h, *dims)
        cp.end()
        return enc

    def run(self, program, t: int = 1, read_back=None) -> int | None:
        """Records `program` (as `record` does) and submits it piece by piece, each
        command buffer as soon as it is recorded: the device runs the first RUN_FIRST
        dispatches while the host records the rest, RUN_PIECE at a time, so the host's
        recording hides behind the device's work instead of coming before it.
        read_back, where given, is (source, staging buffer, bytes): a copy from the start
        of one to the start of the other closing the last piece. Returns the last
        submission's index (`submit`)."""
        at, n = 0, RUN_FIRST
        while True:
            enc = self.record(program[at:at + n], t)
            at += n
            if at >= len(program):
                if read_back is not None:
                    src, dst, nbytes = read_back
                    enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)
                return self.submit([enc.finish()])
            self.submit([enc.finish()])
            n = RUN_PIECE

    def bind(self, kinds: tuple, resources_):
        """A bind group: resources_ are buffers or (buffer, offset, size)."""
        entries = []
        for i, r in enumerate(resources_):
            if isinstance(r, tuple):
                entries.append({"binding": i, "resource": {"buffer": r[0], "offset": r[1],
                                                           "size": r[2]}})
            else:
                entries.append({"binding": i, "resource": {"buffer": r, "offset": 0,
                                                           "size": r.size}})
        return self.dev.create_bind_group(layout=self.layout(kinds)[0], entries=entries)
