"""The project's secret key: where it lives, how it is checked, and the sub-keys derived from it.

One master key (≥ 32 bytes of entropy) keys everything that must not be forgeable or invertible
by someone who can write the data directories; :class:`Keys` derives one sub-key per purpose
(:data:`PURPOSES`). :func:`load_master` says where the key comes from (it is created only for a
fresh configuration); :func:`check_location` refuses a key stored beside the data; an empty or
short key, or a key file readable by group/others, is refused (:class:`LedgerKeyError`). Threat
model: whoever holds the key can enumerate the (small, ~10⁸) MIMIC id space and recover which
subject a hash names; the key protects the registry against everyone else. docs/DELETION.md.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from pipelines.errors import KeyLocationError, LedgerKeyError

KEY_ENV = "FORGETFUL_LEDGER_KEY"
KEY_FILE_ENV = "FORGETFUL_KEY_FILE"
CONFIG_ENV = "FORGETFUL_CONFIG_DIR"
ALLOW_NEAR_ENV = "FORGETFUL_ALLOW_KEY_NEAR_DATA"
SIGNING_KEY_ENV = "FORGETFUL_SIGNING_KEY_FILE"
MIN_KEY_CHARS = 32
PURPOSES = ("subject", "ledger", "gate", "cache", "fingerprint", "content")
ANCHORS = "anchors"


def config_dir() -> Path:
    """The configuration directory (key file, ledger head anchors)."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".config") / "forgetful"


def anchors_dir() -> Path:
    """``<config dir>/anchors``: the newest signed head of every receipt log this configuration
    writes (:func:`pipelines.receipts.logaudit.anchor_path`)."""
    return config_dir() / ANCHORS


def kept_logs() -> list[Path]:
    """The anchor files of this configuration: one per receipt log it has signed a head for.
    Empty for a fresh configuration, the only one in which a key may be created."""
    try:
        return sorted(q for q in anchors_dir().iterdir() if q.suffix == ".json")
    except (FileNotFoundError, NotADirectoryError):
        return []


def missing_key(p: Path, what: str, why: str) -> LedgerKeyError:
    """The one-line refusal for a key file that is not there (nothing is created)."""
    return LedgerKeyError(f"no {what} at {p}{why}: restore {p.name} from your backup (docs/DELETION.md, keys); a key "
                          "is created only for a fresh configuration, so none was made")


def why_not_created(env: str) -> str:
    """Why a missing key file was not created: the configuration keeps a log, or ``$env`` named it."""
    kept = kept_logs()
    if kept:
        return f", but this configuration keeps {len(kept)} receipt log(s) made with it ({anchors_dir()})"
    return f" (named by ${env})" if os.environ.get(env) else ""


def key_file() -> Path:
    return Path(os.environ[KEY_FILE_ENV]).expanduser() if os.environ.get(KEY_FILE_ENV) else config_dir() / "ledger.key"


def _check(raw: bytes, where: str) -> bytes:
    key = raw.strip()
    if len(key) < MIN_KEY_CHARS:
        raise LedgerKeyError(f"the key from {where} has {len(key)} characters; at least {MIN_KEY_CHARS} are required "
                             "(generate one with: python -c 'import secrets; print(secrets.token_hex(32))')")
    return key


def _read_file(p: Path) -> bytes:
    mode = p.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LedgerKeyError(f"key file {p} is accessible by group or others (mode {stat.S_IMODE(mode):o}); "
                             f"run: chmod 600 {p}")
    return _check(p.read_bytes(), str(p))


def load_master(create: bool = True) -> bytes:
    """The master key; created in the config dir when missing (a fresh configuration only).

    Where the key comes from (first match):

    1. ``$FORGETFUL_LEDGER_KEY`` — the key itself (≥ 32 characters);
    2. ``$FORGETFUL_KEY_FILE`` — a key file;
    3. ``<config dir>/ledger.key`` where the config dir is ``$FORGETFUL_CONFIG_DIR``, else
       ``$XDG_CONFIG_HOME/forgetful``, else ``~/.config/forgetful`` — created with 64 random hex
       characters, mode 0600, in a directory of mode 0700, **only for a fresh configuration**: one
       that has anchored no receipt log yet (:func:`kept_logs`). A key missing from a configuration
       that keeps a log is one typed line naming the recovery (restore it from the backup), never a
       new key that could neither verify nor extend that log.
    """
    env = os.environ.get(KEY_ENV)
    if env is not None:
        return _check(env.encode(), f"${KEY_ENV}")
    p = key_file()
    if p.is_file():
        return _read_file(p)
    if p.exists():
        raise LedgerKeyError(f"key path {p} exists but is not a file")
    if not create or os.environ.get(KEY_FILE_ENV) or kept_logs():
        raise missing_key(p, f"key (and ${KEY_ENV} is unset)", why_not_created(KEY_FILE_ENV))
    write_private(p, (secrets.token_hex(32) + "\n").encode())
    return _read_file(p)


def write_private(p: Path, data: bytes) -> bool:
    """Create ``p`` with ``data``, mode 0600, in a folder created 0700; fsynced. Returns False
    (and writes nothing) when the file exists already (created concurrently by another process).
    The folder itself must not be a symbolic link (:func:`pipelines.store.safe_io.refuse_link`)."""
    from pipelines.store.safe_io import refuse_link

    refuse_link(p.parent, "configuration folder")
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def check_location(key_paths: list[Path], warehouse: Path, inside: list[Path]) -> None:
    """Refuse a key file, or the config folder (keys and anchors), that lies beside ``warehouse``
    (anywhere under its folder) or inside one of the ``inside`` folders (the ledger, runs and
    export folders), unless ``$FORGETFUL_ALLOW_KEY_NEAR_DATA=1``: whoever copies or backs up the
    data folder must not get the keys with it. A folder that is the home directory or contains it
    (``--runs ~``) is not held against the default config folder."""
    if os.environ.get(ALLOW_NEAR_ENV) == "1":
        return
    home = Path.home().resolve()
    beside = Path(warehouse).resolve().parent
    places = [*(Path(d).resolve() for d in inside), beside]  # the most specific folder is named
    places = [d for d in places if not home.is_relative_to(d)]
    secrets_ = [(f"key file {Path(k).expanduser().resolve()}", Path(k).expanduser().resolve()) for k in key_paths]
    secrets_.append((f"the config folder {config_dir().expanduser().resolve()} (keys, anchors)",
                     config_dir().expanduser().resolve()))
    for what, q in secrets_:
        for d in places:
            if q.is_relative_to(d):
                where = "beside the warehouse" if d == beside else f"inside the data folder {d}"
                raise KeyLocationError(f"{what} lies {where}, where a copy or backup of the data would carry it: move "
                                       f"it out (FORGETFUL_CONFIG_DIR / FORGETFUL_KEY_FILE / "
                                       f"FORGETFUL_SIGNING_KEY_FILE) or set {ALLOW_NEAR_ENV}=1 to accept it")


def signing_key_file() -> Path:
    """Where the Ed25519 signing key of the receipt log lives (``$FORGETFUL_SIGNING_KEY_FILE`` or
    ``<config dir>/signing.key``); the key itself is read by :mod:`pipelines.receipts.signing`."""
    env = os.environ.get(SIGNING_KEY_ENV)
    return Path(env).expanduser() if env else config_dir() / "signing.key"


def key_files() -> list[Path]:
    """The key files in use (the HMAC key file unless the key comes from ``$FORGETFUL_LEDGER_KEY``,
    and the signing key file)."""
    return ([] if os.environ.get(KEY_ENV) is not None else [key_file()]) + [signing_key_file()]


class Keys:
    """Purpose-separated sub-keys of one master key. ``Keys.load()`` reads the configured key.

    =====================  =============================================================
    sub-key                used for
    =====================  =============================================================
    ``subject``            HMAC of subject and stay ids (the forget registry, receipts)
    ``content``            HMAC of a forgotten stay's hourly content (:mod:`cohort.build.content`)
    ``ledger``             the MAC chain of the receipt ledger
    ``gate``               the MAC of every stored gate state
    ``cache``              the MAC of every task-cache file
    ``fingerprint``        a public fingerprint recorded in every ledger row
    =====================  =============================================================
    """

    def __init__(self, master: bytes):
        master = _check(master, "the given key")
        self._sub = {p: hmac.new(master, f"forgetful/{p}/v1".encode(), hashlib.sha256).digest() for p in PURPOSES}

    @classmethod
    def load(cls, create: bool = True) -> Keys:
        return cls(load_master(create))

    @property
    def fingerprint(self) -> str:
        """Public 16-hex fingerprint of the key (recorded in the ledger; reveals nothing of the key)."""
        return self._sub["fingerprint"].hex()[:16]

    def mac(self, purpose: str, data: bytes) -> str:
        """HMAC-SHA256 (hex) of ``data`` under the ``purpose`` sub-key."""
        return hmac.new(self._sub[purpose], data, hashlib.sha256).hexdigest()

    def subject_hash(self, subject_id: int) -> str:
        return self.mac("subject", f"subject:{int(subject_id)}".encode())

    def stay_hash(self, stay_id: int) -> str:
        return self.mac("subject", f"stay:{int(stay_id)}".encode())

    def content_hash(self, block: bytes) -> str:
        """Keyed fingerprint of one block of a stay's hourly content (:func:`cohort.build.content.blocks`)."""
        return self.mac("content", block)

    @staticmethod
    def equal(a: str, b: str) -> bool:
        return hmac.compare_digest(str(a), str(b))


#: resolved warehouse path -> the keys of its handle open in this process
#: (:meth:`pipelines.store.warehouse.Warehouse.open` keeps it while the handle is open)
HELD: dict[Path, Keys] = {}


def for_warehouse(warehouse: str | os.PathLike) -> Keys:
    """The keys of the warehouse's open handle in this process, else the configured keys, loaded
    (a chunk on a Dask worker has no handle)."""
    k = HELD.get(Path(warehouse).resolve())
    return k if k is not None else Keys.load()
