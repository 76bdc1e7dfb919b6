"""A fake Hugging Face Hub for tests (no network): repos are folders of files under a
root, served through the three huggingface_hub calls `cortiq.hub` makes."""
from __future__ import annotations

import shutil
from pathlib import Path


class FakeHub:
    """list_repo_files / hf_hub_download / snapshot_download over `root/org/name/...`,
    recording each call and whether huggingface_hub's progress bars were on."""

    def __init__(self, root: Path):
        self.root = root
        self.calls: list[tuple] = []
        self.bars: list[bool] = []

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            p = self.root / repo / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

    def _repo(self, repo):
        d = self.root / repo
        if not d.is_dir():
            raise _not_found(repo)
        return d

    def list_repo_files(self, repo, *, revision=None, **_):
        self.calls.append(("list", repo, revision))
        d = self._repo(repo)
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())

    def hf_hub_download(self, repo, filename, *, revision=None, local_dir=None, **_):
        from huggingface_hub.utils import are_progress_bars_disabled
        self.calls.append(("download", repo, filename))
        self.bars.append(not are_progress_bars_disabled())
        out = Path(local_dir) / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._repo(repo) / filename, out)
        return str(out)

    def snapshot_download(self, repo, *, revision=None, local_dir=None, allow_patterns=(),
                          **_):
        import fnmatch
        self.calls.append(("snapshot", repo, revision))
        for f in self.list_repo_files(repo):
            if any(fnmatch.fnmatch(f, pat) for pat in allow_patterns):
                out = Path(local_dir) / f
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.root / repo / f, out)
        return str(local_dir)


def _not_found(repo):
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError
    req = httpx.Request("GET", f"https://huggingface.co/api/models/{repo}")
    return RepositoryNotFoundError(f"404 {repo}", response=httpx.Response(404, request=req))


def install(tmp_path: Path, monkeypatch) -> FakeHub:
    """A FakeHub in place of huggingface_hub's calls, and the cache in `tmp_path`."""
    import huggingface_hub
    fake = FakeHub(tmp_path / "hub-fixture")
    for name in ("list_repo_files", "hf_hub_download", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, getattr(fake, name))
    monkeypatch.setenv("CORTIQ_CACHE", str(tmp_path / "cache"))
    return fake
