"""tools/publish.py: dry run on a real build, an upload to a local fake Hub, and the refusals.

No network: the only server is an http.server bound to 127.0.0.1 (port 0) in a thread,
answering the part of the Hub API that huggingface_hub uses for create_repo,
create_branch, list_repo_files, create_commit (preupload, LFS batch + PUT, commit) and
the README metadata check. The publish tool runs as a subprocess pointed at it through
HF_ENDPOINT, with HF_TOKEN=dummy, HF_HUB_OFFLINE unset (conftest sets it) and
HF_HUB_DISABLE_XET=1 (so binaries go through the plain LFS protocol, not Xet).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISH = ROOT / "tools" / "publish.py"
REPO_ID = "org/fused-mlp"


def _build_toml() -> dict:
    import tomllib

    with open(ROOT / "build.toml", "rb") as f:
        return tomllib.load(f)


VERSION = _build_toml()["general"]["version"]
BRANCH = f"v{VERSION}"


# --------------------------------------------------------------------------------------
# a fake Hub


class FakeHub:
    """Just enough of the Hub for tools/publish.py; records every request."""

    def __init__(self):
        self.requests: list[dict] = []
        self.repos: dict[tuple[str, str], dict[str, dict[str, bytes]]] = {}  # (type, id) -> branch -> files
        self.commits: list[dict] = []
        self.lfs: dict[str, bytes] = {}
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _send(self, code: int, obj=None, headers: dict | None = None):
                data = json.dumps(obj if obj is not None else {}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str):
                url = urlparse(self.path)
                body = self._body()
                with hub.lock:
                    hub.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                         "auth": self.headers.get("Authorization"), "body": body})
                    code, obj, headers = hub.route(method, url.path, parse_qs(url.query), body, self)
                self._send(code, obj, headers)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PUT(self):
                self._handle("PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # -- routing
    def route(self, method, path, query, body, handler):
        if method == "POST" and path == "/api/repos/create":
            req = json.loads(body)
            key = (req.get("type", "model"), f"{req['organization']}/{req['name']}")
            if key in self.repos:  # the Hub's 409 names the existing repo's url too
                return 409, {"error": "You already created this repo", "url": f"{self.url}/{key[0]}s/{key[1]}"}, None
            self.repos[key] = {"main": {".gitattributes": b"*.so filter=lfs diff=lfs merge=lfs -text\n"}}
            return 200, {"url": f"{self.url}/{key[0]}s/{key[1]}", "name": key[1]}, None
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, None
        m = re.fullmatch(r"/(\w+)s/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path)
        if method == "POST" and m:
            req = json.loads(body)
            objs = [{"oid": o["oid"], "size": o["size"],
                     "actions": {"upload": {"href": f"{self.url}/lfs-upload/{o['oid']}"}}} for o in req["objects"]]
            return 200, {"transfer": "basic", "objects": objs}, None
        m = re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path)
        if method == "PUT" and m:
            if hashlib.sha256(body).hexdigest() != m.group(1):
                return 400, {"error": "sha256 mismatch"}, None
            self.lfs[m.group(1)] = body
            return 200, {}, None
        m = re.fullmatch(r"/api/(\w+)s/([^/]+/[^/]+)/(branch|tree|preupload|commit)/(.+)", path)
        if m:
            rtype, repo_id, action, rest = m.groups()
            repo = self.repos.get((rtype, repo_id))
            if repo is None:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            return getattr(self, f"_{action}")(method, repo, rtype, repo_id, unquote(rest), query, body)
        self.unexpected.append(f"{method} {path}")
        return 404, {"error": f"fake hub: no route for {method} {path}"}, None

    def _branch(self, method, repo, rtype, repo_id, branch, query, body):
        if branch in repo:
            return 409, {"error": "Reference already exists"}, None
        start = (json.loads(body) if body else {}).get("startingPoint") or "main"
        repo[branch] = dict(repo[start])
        return 200, {}, None

    def _tree(self, method, repo, rtype, repo_id, rest, query, body):
        rev, _, sub = rest.partition("/")
        if rev not in repo:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        files = repo[rev]
        out, dirs = [], set()
        for p, data in sorted(files.items()):
            if sub and not p.startswith(sub + "/"):
                continue
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            out.append({"type": "file", "path": p, "size": len(data), "oid": hashlib.sha1(data).hexdigest()})
        out += [{"type": "directory", "path": d, "oid": "0" * 40} for d in sorted(dirs)]
        return 200, out, None

    def _preupload(self, method, repo, rtype, repo_id, rev, query, body):
        req = json.loads(body)
        files = []
        for f in req["files"]:
            binary = b"\0" in base64.b64decode(f["sample"])
            files.append({"path": f["path"], "uploadMode": "lfs" if binary else "regular", "shouldIgnore": False})
        return 200, {"files": files}, None

    def _commit(self, method, repo, rtype, repo_id, rev, query, body):
        if rev not in repo:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        lines = [json.loads(l) for l in body.decode().splitlines() if l.strip()]
        header = lines[0]["value"]
        files = repo[rev]
        rec = {"repo_type": rtype, "repo_id": repo_id, "branch": rev, "summary": header["summary"],
               "added": [], "lfs": [], "deleted": []}
        for item in lines[1:]:
            v = item["value"]
            if item["key"] == "file":
                files[v["path"]] = base64.b64decode(v["content"])
                rec["added"].append(v["path"])
            elif item["key"] == "lfsFile":
                if v["oid"] not in self.lfs:
                    return 400, {"error": f"LFS object {v['oid']} was not uploaded"}, None
                files[v["path"]] = self.lfs[v["oid"]]
                rec["added"].append(v["path"])
                rec["lfs"].append(v["path"])
            elif item["key"] == "deletedFile":
                if v["path"] not in files:
                    return 404, {"error": "A file with this name doesn't exist"}, {"X-Error-Code": "EntryNotFound"}
                del files[v["path"]]
                rec["deleted"].append(v["path"])
            else:
                return 400, {"error": f"unsupported key {item['key']}"}, None
        self.commits.append(rec)
        oid = hashlib.sha1(json.dumps(rec).encode()).hexdigest()
        return 200, {"commitUrl": f"{self.url}/{rtype}s/{repo_id}/commit/{oid}", "commitOid": oid,
                     "pullRequestUrl": None}, None


# --------------------------------------------------------------------------------------
# helpers and fixtures


def run_publish(*args, endpoint: str | None, token: str | None = "dummy", tmp_home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE", "HF_ENDPOINT")}
    env["HF_HOME"] = str(tmp_home)  # no login cache
    env["HF_HUB_DISABLE_XET"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"  # else the user agent is built with a GET /api/agent-harnesses
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, str(PUBLISH), *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def _load_build_variant():
    spec = importlib.util.spec_from_file_location("_bv_for_tests", ROOT / "tools" / "build_variant.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _complete(vdir: Path) -> bool:
    md = vdir / "metadata.json"
    if not md.is_file() or not (vdir / "__init__.py").is_file() or not (vdir / "_ops.py").is_file():
        return False
    meta = json.loads(md.read_text())
    return (vdir / f"{meta['id']}.abi3.so").is_file() and meta.get("version") == VERSION


@pytest.fixture(scope="module")
def real_build(tmp_path_factory) -> Path:
    """A build dir holding a copy of a REAL built variant for the installed torch.

    tools/test.sh builds build/<variant> before pytest runs; we copy it (so a concurrent
    rebuild cannot change it under us). Without one, build the CPU variant into tmp.
    """
    bv = _load_build_variant()
    out = tmp_path_factory.mktemp("realbuild") / "build"
    out.mkdir()
    for backend in dict.fromkeys([bv.detect_backend(), "cpu"]):
        src = ROOT / "build" / bv.variant_name(backend)
        if _complete(src):
            shutil.copytree(src, out / src.name, ignore=shutil.ignore_patterns("__pycache__"))
            if _complete(out / src.name):
                return out
            shutil.rmtree(out / src.name)
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "build_variant.py"), "--backend", "cpu",
                          "--out", str(out), "--jobs", "2"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


@pytest.fixture
def bench_dir(tmp_path) -> Path:
    d = tmp_path / "benchmarks"
    (d / "results").mkdir(parents=True)
    (d / "benchmark_act.py").write_text("from kernels.benchmark import Benchmark\n\nclass Act(Benchmark):\n    pass\n")
    (d / "results" / "h200.json").write_text(json.dumps({
        "results": [{"workload": "Act.silu", "timingResults": {"mean_ms": 0.0123, "std_ms": 0.001}, "verified": True}],
        "machineInfo": {"gpu": "NVIDIA H200", "backend": "cuda", "pytorchVersion": "2.11.0", "os": "linux",
                        "cpu": "x86_64"},
    }))
    return d


def fake_variant(build: Path, name: str = "torch213-cxx11-cpu-x86_64-linux", *, version: int = VERSION,
                 ident: str = "_fused_mlp_cpu_0123456789") -> Path:
    """A structurally valid compiled variant (the .so is a stand-in: nothing loads it)."""
    v = build / name
    v.mkdir(parents=True)
    (v / "__init__.py").write_text("from ._ops import ops\n")
    (v / "_ops.py").write_text(f"import torch\nops = torch.ops.{ident}\n")
    (v / f"{ident}.abi3.so").write_bytes(b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 64)
    meta = {"name": "fused-mlp", "id": ident, "version": version, "license": "Apache-2.0",
            "python-depends": [], "backend": {"type": "cpu"}}
    (v / "metadata.json").write_text(json.dumps(meta))
    return v


def expected_files(build: Path, bench: Path | None) -> dict[str, Path]:
    out = {}
    for v in build.iterdir():
        for f in v.rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                out[f"build/{v.name}/{f.relative_to(v).as_posix()}"] = f
    if bench:
        for f in bench.glob("*.py"):
            out[f"benchmarks/{f.name}"] = f
        for f in (bench / "results").glob("*.json"):
            out[f"benchmarks/results/{f.name}"] = f
    return out


# --------------------------------------------------------------------------------------
# tests


def test_dry_run_on_real_build_lists_every_file_and_sends_nothing(real_build, bench_dir, tmp_path):
    with FakeHub() as hub:
        res = run_publish("--dry-run", "--build-dir", str(real_build), "--benchmarks-dir", str(bench_dir),
                          endpoint=hub.url, token=None, tmp_home=tmp_path)
    assert res.returncode == 0, res.stderr
    assert hub.requests == []  # no network at all, and no token needed
    out = res.stdout
    assert f"create repo {REPO_ID} (repo_type='kernel')" in out
    assert f"create branch {BRANCH}" in out
    files = expected_files(real_build, bench_dir)
    assert any(p.endswith(".abi3.so") for p in files)
    for path, local in files.items():
        sha = hashlib.sha256(local.read_bytes()).hexdigest()
        assert f"add {path}  {local.stat().st_size} bytes  sha256 {sha}" in out, path
    assert f"one commit on {BRANCH}: {len(files)} file(s)" in out
    assert "one commit on main: add README.md" in out
    assert "nothing was sent" in out


def test_publish_to_local_hub(real_build, bench_dir, tmp_path):
    variant = next(real_build.iterdir()).name
    files = expected_files(real_build, bench_dir)
    with FakeHub() as hub:
        res = run_publish("--build-dir", str(real_build), "--benchmarks-dir", str(bench_dir),
                          endpoint=hub.url, tmp_home=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr

        # the repository is of type kernel, every API call went to /api/kernels/...
        create = [r for r in hub.requests if r["path"] == "/api/repos/create"]
        assert len(create) == 1 and json.loads(create[0]["body"])["type"] == "kernel"
        generic = ("/api/repos/create", "/api/validate-yaml", "/api/agent-harnesses")
        api_paths = [r["path"] for r in hub.requests if r["path"].startswith("/api/") and r["path"] not in generic]
        assert api_paths and all(p.startswith(f"/api/kernels/{REPO_ID}/") for p in api_paths), api_paths
        assert all(r["auth"] == "Bearer dummy" for r in hub.requests if r["path"].startswith("/api/"))
        assert any(r["path"] == f"/api/kernels/{REPO_ID}/branch/{BRANCH}" for r in hub.requests)
        assert not hub.unexpected

        # one commit on v{version} with exactly the build + benchmark files, then the card on main
        assert [c["branch"] for c in hub.commits] == [BRANCH, "main"]
        vcommit, card = hub.commits
        assert vcommit["repo_type"] == "kernel"
        assert sorted(vcommit["added"]) == sorted(files)
        assert vcommit["deleted"] == []
        assert any(p.endswith(".abi3.so") for p in vcommit["lfs"])  # binaries went through LFS
        remote = hub.repos[("kernel", REPO_ID)]
        for path, local in files.items():
            assert remote[BRANCH][path] == local.read_bytes(), path
        assert card["added"] == ["README.md"]
        readme = remote["main"]["README.md"].decode()
        assert f'get_kernel("{REPO_ID}", version={VERSION})' in readme
        assert f"`{variant}`" in readme
        assert "NVIDIA H200" in readme and "0.0123" in readme  # benchmark table from results/*.json

        # second publish: a stale file of this variant is deleted, another variant's files are kept
        remote[BRANCH][f"build/{variant}/stale_module.py"] = b"old\n"
        remote[BRANCH]["build/torch299-cxx11-cpu-x86_64-linux/__init__.py"] = b"other\n"
        n_create = len(create)
        res = run_publish("--build-dir", str(real_build), "--benchmarks-dir", str(bench_dir),
                          endpoint=hub.url, tmp_home=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        assert hub.commits[2]["branch"] == BRANCH
        assert hub.commits[2]["deleted"] == [f"build/{variant}/stale_module.py"]
        assert "build/torch299-cxx11-cpu-x86_64-linux/__init__.py" in remote[BRANCH]
        assert f"build/{variant}/stale_module.py" not in remote[BRANCH]
        assert len([r for r in hub.requests if r["path"] == "/api/repos/create"]) == n_create + 1  # 409: exists
    assert n_create == 1


@pytest.fixture(scope="module")
def publish_mod():
    spec = importlib.util.spec_from_file_location("_publish_for_tests", PUBLISH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def run_inprocess(publish_mod, capsys, *args) -> tuple[int, str, str]:
    """The refusals happen before any network call: run main() in this process (fast)."""
    capsys.readouterr()
    rc = publish_mod.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_refuses_without_token(publish_mod, real_build, tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # no login cache
    with FakeHub() as hub:
        rc, out, err = run_inprocess(publish_mod, capsys, "--build-dir", str(real_build), "--benchmarks-dir",
                                     str(tmp_path / "none"), "--endpoint", hub.url)
    assert rc != 0
    assert "no Hugging Face token" in err
    assert hub.requests == []


def test_refuses_version_mismatch(publish_mod, tmp_path, capsys):
    build = tmp_path / "build"
    fake_variant(build, version=VERSION + 1)
    with FakeHub() as hub:
        rc, out, err = run_inprocess(publish_mod, capsys, "--build-dir", str(build), "--endpoint", hub.url)
    assert rc != 0
    assert f"does not match build.toml version {VERSION}" in err
    assert hub.requests == []


def test_refuses_empty_build(publish_mod, tmp_path, capsys):
    build = tmp_path / "build"
    (build / "_work").mkdir(parents=True)  # scratch space is not a variant
    with FakeHub() as hub:
        rc, out, err = run_inprocess(publish_mod, capsys, "--build-dir", str(build), "--endpoint", hub.url)
    assert rc != 0
    assert "no built variant" in err
    assert hub.requests == []


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("metadata.json", "missing metadata.json"),
        ("_ops.py", "missing _ops.py"),
        ("__init__.py", "missing __init__.py"),
        ("so", "compiled variant without its extension"),
        ("rename-so", "does not match the extension"),
        ("bad-metadata", "not accepted by kernels._rust.Metadata"),
    ],
)
def test_refuses_partial_variant(publish_mod, tmp_path, capsys, breakage, message):
    build = tmp_path / "build"
    fake_variant(build, name="torch212-cxx11-cpu-x86_64-linux", ident="_fused_mlp_cpu_aaaaaaaaaa")  # a good one
    v = fake_variant(build)
    so = v / "_fused_mlp_cpu_0123456789.abi3.so"
    if breakage == "so":
        so.unlink()
    elif breakage == "rename-so":
        so.rename(v / "_fused_mlp_cpu_9999999999.abi3.so")
    elif breakage == "bad-metadata":
        (v / "metadata.json").write_text(json.dumps({"name": "fused-mlp", "version": VERSION}))
    else:
        (v / breakage).unlink()
    with FakeHub() as hub:
        rc, out, err = run_inprocess(publish_mod, capsys, "--build-dir", str(build), "--endpoint", hub.url,
                                     "--dry-run")
        rc2, _, err2 = run_inprocess(publish_mod, capsys, "--build-dir", str(build), "--endpoint", hub.url)
    assert rc != 0 and rc2 != 0  # refused with and without --dry-run
    assert message in err and message in err2, err
    assert v.name in err
    assert "torch212-cxx11-cpu-x86_64-linux" not in err  # the complete one is not blamed
    assert hub.requests == []


def test_card_separates_runner_output_from_own_results(publish_mod, bench_dir):
    """`kernels benchmark` output becomes table rows; the project's own bench_*.py results
    (another format) are listed as files, never as empty rows of that table."""
    (bench_dir / "results" / "act_and_mul_h200.json").write_text(json.dumps({"gpu": "NVIDIA H200", "rows": []}))
    files = publish_mod.collect_benchmarks(bench_dir)
    conf = {"general": {"name": "fused-mlp", "version": VERSION, "license": "Apache-2.0"}}
    card = publish_mod.kernel_card(conf, REPO_ID, [], files).decode()
    assert "| Act.silu | NVIDIA H200 |" in card
    assert "not a `kernels benchmark` result" not in card
    own = card.split("## Measurements against other implementations", 1)
    assert len(own) == 2 and "- `benchmarks/results/act_and_mul_h200.json`" in own[1]
    assert "h200.json`" not in own[1].replace("act_and_mul_h200.json", "")
