"""A fake Hugging Face Hub for tests: the few endpoints `huggingface_hub.snapshot_download`
calls (huggingface_hub 1.x), served by FastAPI on a free 127.0.0.1 port in a thread.

- GET  /api/models/{repo}[/revision/{rev}] repo info: commit `sha`, `siblings`
- GET  /api/models/{repo}/tree/{rev}      the file listing (recursive), with LFS metadata
- HEAD /{repo}/resolve/{rev}/{file}       metadata headers: X-Repo-Commit, ETag, Content-Length
- GET  /{repo}/resolve/{rev}/{file}       the bytes; `Range: bytes=N-` answers 206

Errors carry `X-Error-Code` as the hub does (RepoNotFound, RevisionNotFound, GatedRepo,
EntryNotFound), which is how huggingface_hub picks its exception classes. Every request is
logged in `FakeHub.requests` so tests can check what the client asked for.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    token: str | None = None                             # set: gated, needs this token


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    interrupt_once: set[str] = field(default_factory=set)  # files whose first GET breaks near the end

    def add_folder(self, repo_id: str, folder: Path, *, token: str | None = None,
                   tags: tuple[str, ...] = ()) -> FakeRepo:
        files = {str(p.relative_to(folder)).replace("\\", "/"): p.read_bytes()
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        commit = hashlib.sha1(repr(sorted((k, hashlib.sha1(v).hexdigest())
                                          for k, v in files.items())).encode()).hexdigest()
        repo = FakeRepo(files, commit, {"main": commit, **{t: commit for t in tags}}, token)
        self.repos[repo_id] = repo
        return repo

    def gets(self, filename: str) -> list[str | None]:
        """The Range header of every GET of `filename` (None: the whole file)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + filename)]


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status,
                        headers={"X-Error-Code": code, "X-Error-Message": message})


def _is_lfs(path: str) -> bool:
    return path.endswith((".safetensors", ".bin", ".pt"))


def create_app(hub: FakeHub) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def log(request: Request, call_next):
        hub.requests.append((request.method, request.url.path, request.headers.get("range")))
        return await call_next(request)

    def lookup(repo_id: str, rev: str, request: Request, files: bool = False
               ) -> tuple[FakeRepo | None, str | None, Response | None]:
        """files: a file download, which a gated repo serves only with its token (its info
        and file listing are public, as on the hub)."""
        repo = hub.repos.get(repo_id)
        if repo is None:  # the hub answers 401 for unknown and private repos alike
            return None, None, _error(401, "RepoNotFound", f"Repository {repo_id} not found")
        if files and repo.token is not None and \
                request.headers.get("authorization") != f"Bearer {repo.token}":
            return None, None, _error(401, "GatedRepo",
                                      f"Access to model {repo_id} is restricted.")
        commit = repo.refs.get(rev, rev if rev == repo.commit else None)
        if commit is None:
            return None, None, _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return repo, commit, None

    @app.get("/api/models/{org}/{name}")
    @app.get("/api/models/{org}/{name}/revision/{rev:path}")
    def revision(org: str, name: str, request: Request, rev: str = "main"):
        repo, commit, error = lookup(f"{org}/{name}", rev, request)
        if error is not None:
            return error
        return {"id": f"{org}/{name}", "sha": commit, "private": False,
                "gated": "manual" if repo.token else False,
                "siblings": [{"rfilename": p} for p in repo.files]}

    @app.get("/api/models/{org}/{name}/tree/{rev:path}")
    def tree(org: str, name: str, rev: str, request: Request):
        repo, commit, error = lookup(f"{org}/{name}", rev, request)
        if error is not None:
            return error
        entries = []
        for path, data in repo.files.items():
            entry = {"type": "file", "path": path, "size": len(data),
                     "oid": hashlib.sha1(data).hexdigest()}
            if _is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            entries.append(entry)
        return entries

    @app.api_route("/{org}/{name}/resolve/{rev}/{path:path}", methods=["GET", "HEAD"])
    def resolve(org: str, name: str, rev: str, path: str, request: Request):
        repo, commit, error = lookup(f"{org}/{name}", rev, request, files=True)
        if error is not None:
            return error
        data = repo.files.get(path)
        if data is None:
            return _error(404, "EntryNotFound", f"{path} does not exist at {rev}")
        etag = hashlib.sha256(data).hexdigest() if _is_lfs(path) else hashlib.sha1(data).hexdigest()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return Response(headers={**headers, "Content-Length": str(len(data))})
        start, status = 0, 200
        range_header = request.headers.get("range")
        if range_header:
            start, status = int(range_header.removeprefix("bytes=").split("-")[0]), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        if path in hub.interrupt_once and start == 0:
            hub.interrupt_once.discard(path)

            def broken():  # all but the last KB, then the connection drops
                yield body[: len(body) - 1024]
                raise ConnectionResetError("fake hub: connection dropped")

            return StreamingResponse(broken(), status_code=status, headers=headers)
        return Response(body, status_code=status, headers=headers)

    return app


@contextlib.contextmanager
def serve_fake_hub(hub: FakeHub):
    """Yield the base URL of `hub` served by uvicorn in a thread on a free loopback port."""
    import socket

    import httpx
    import uvicorn

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(hub), host="127.0.0.1", port=port,
                                           log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if server.started:
                break
            threading.Event().wait(0.05)
        httpx.get(url + "/api/models/none/none/revision/main", timeout=5)
        hub.requests.clear()
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
