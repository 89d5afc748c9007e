"""The man page (doc/idemproxy.1), `idemproxy --help` and doc/configuration.md's options
table agree: the same options, each with the same argument, environment
variable and default. `--help` is the reference, since it is printed from the
option table that the binary parses with. The roff source is parsed directly,
so neither man nor groff is needed.
"""
import os
import re
import subprocess

from fixtures.pki import make_pki
from fixtures.proxy import IDEMPROXY_BIN, REPO, clean_env, run_binary

MANPAGE = os.path.join(REPO, "doc", "idemproxy.1")
README = os.path.join(REPO, "doc", "configuration.md")  # the options table, the file
MESON = os.path.join(REPO, "meson.build")

# README's default column is prose where there is no literal default; these are
# the words it may use, and what --help shows for them (None: no default).
README_PROSE_DEFAULTS = {"required": None, "none: memory store": None, "none": None,
                         "off": "false"}


# --------------------------------------------------------------------------- --help

# Options that do something and exit, with no variable and no default.
ACTIONS = ("--help", "--version", "--check-config")


def parse_help():
    """Returns ({flag: {"arg", "env", "default"}}, {env-only name: default})."""
    r = run_binary(["--help"])
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    options, env_only = {}, {}
    section = None
    current = None
    for line in out.splitlines():
        if line == "Options:":
            section = "options"
        elif line == "Environment only:":
            section = "env"
        elif section and line.startswith("  ") and not line.startswith("   "):
            head = line.strip()
            if section == "options":
                flag, _, arg = head.partition(" ")
                current = options[flag] = {"arg": arg or None, "env": None, "default": None}
            else:
                name = head.partition("=")[0]
                current = {"default": None}
                env_only[name] = current
        elif current is not None and line.strip().startswith("[") and line.strip().endswith("]"):
            for part in line.strip()[1:-1].split(", "):
                if part.startswith("env "):
                    current["env"] = part[len("env "):]
                elif part.startswith("default "):
                    current["default"] = part[len("default "):]
    env_only = {k: v["default"] for k, v in env_only.items()}
    return options, env_only


# --------------------------------------------------------------------------- roff

def roff_args(rest):
    """Splits macro arguments as roff does: by spaces, "double quotes" group."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', rest)]


def roff_unescape(s):
    s = re.sub(r"\\f(\[[^]]*\]|.)", "", s)  # font changes
    for esc, ch in (("\\-", "-"), ("\\&", ""), ("\\(dq", '"'), ("\\(aq", "'"), ("\\(en", "-"),
                    ("\\(em", "-"), ("\\e", "\\")):
        s = s.replace(esc, ch)
    return s


def roff_text(line):
    """The text one source line contributes (font macros resolved), or None
    for a request that is not text (.TP, .PP, ...)."""
    if line.startswith("."):
        macro, _, rest = line[1:].partition(" ")
        if macro in ("B", "I", "SM"):
            return roff_unescape(" ".join(roff_args(rest)))
        if macro in ("BR", "BI", "IR", "IB", "RB", "RI"):
            return roff_unescape("".join(roff_args(rest)))
        return None
    return roff_unescape(line)


def parse_manpage():
    """Returns {section: [(tag, body)]}: every .TP entry of every .SH section,
    its tag and body as plain text."""
    sections = {}
    entries = None
    tag = body = None
    expect_tag = False

    def flush():
        if tag is not None:
            entries.append((tag, " ".join(body)))

    with open(MANPAGE, encoding="utf-8") as f:
        lines = [ln.rstrip("\n") for ln in f if not ln.startswith('.\\"')]
    for line in lines:
        if line.startswith(".SH "):
            if entries is not None:
                flush()
            entries = sections.setdefault(" ".join(roff_args(line[4:])), [])
            tag = body = None
            expect_tag = False
        elif line == ".TP":
            if entries is not None:
                flush()
            tag, body = None, []
            expect_tag = True
        elif line in (".PP", ".P", ".LP", ".RS", ".RE"):
            if entries is not None:
                flush()
            tag = body = None
        elif expect_tag:
            tag = roff_text(line)
            expect_tag = False
        elif tag is not None:
            text = roff_text(line)
            if text is not None:
                body.append(text)
    if entries is not None:
        flush()
    return sections


ENTRY_RE = re.compile(r"Environment: (?P<env>.+?); (?:no default|default: (?P<default>\S+?))\.$")


def man_options():
    """{flag: {"arg", "envs", "default"}} from the OPTIONS section."""
    out = {}
    for tag, body in parse_manpage()["OPTIONS"]:
        assert tag.startswith("--"), "OPTIONS entry that is not an option: %r" % tag
        flag, _, arg = tag.partition(" ")
        flag = flag.rstrip(",")  # "--help, -h"
        entry = {"arg": arg or None, "envs": [], "default": None}
        if flag not in ACTIONS:
            m = ENTRY_RE.search(body)
            assert m, "man page: %s does not end with 'Environment: ...; default: ...': %r" % (
                flag, body)
            entry["envs"] = m.group("env").split(", then ")
            entry["default"] = m.group("default")
        else:
            entry["arg"] = None
        assert flag not in out, "man page lists %s twice" % flag
        out[flag] = entry
    return out


# --------------------------------------------------------------------------- README

def readme_options():
    """[(flags, arg, envs, default)] for each row of README's options table;
    default is the text of the cell (a code span's content, else the prose)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| option "):
            continue
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        assert len(cells) == 4, "README options row without 4 cells: %r" % line
        option, env, default, _meaning = cells
        spans = re.findall(r"`([^`]*)`", option)
        flags, arg = [], None
        for span in spans:
            flag, _, a = span.partition(" ")
            flags.append(flag)
            arg = a or None
        envs = re.findall(r"`([^`]*)`", env)
        m = re.fullmatch(r"`([^`]*)`", default)
        rows.append((flags, arg, envs, m.group(1) if m else (default or None)))
    return rows


# --------------------------------------------------------------------------- tests

def test_version_matches_meson_project():
    with open(MESON, encoding="utf-8") as f:
        version = re.search(r"project\('idemproxy',.*?version: '([^']+)'", f.read(), re.S).group(1)
    r = run_binary(["--version"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "idemproxy %s\n" % version
    with open(MANPAGE, encoding="utf-8") as f:
        th = next(ln for ln in f if ln.startswith(".TH "))
    assert roff_args(th[4:])[0:2] == ["IDEMPROXY", "1"], th
    assert roff_args(th[4:])[3] == "idemproxy %s" % version, th


def test_manpage_is_installed_by_meson():
    with open(MESON, encoding="utf-8") as f:
        assert "install_man('doc/idemproxy.1')" in f.read()


def test_manpage_has_the_sections():
    sections = parse_manpage()
    for name in ("OPTIONS", "STORES", "ADMIN ENDPOINTS", "SIGNALS", "EXIT STATUS",
                 "ENVIRONMENT", "FILES", "EXAMPLES", "SEE ALSO"):
        assert name in sections, "man page has no %s section" % name
    files = [tag for tag, _ in sections["FILES"]]
    assert files[:3] == ["/etc/idemproxy/idemproxy.yaml", "/etc/default/idemproxy",
                         "/lib/systemd/system/idemproxy.service"], files
    with open(MANPAGE, encoding="utf-8") as f:
        src = f.read()
    for name in ("NAME", "SYNOPSIS", "DESCRIPTION"):
        assert "\n.SH %s\n" % name in src
    admin = [tag for tag, _ in sections["ADMIN ENDPOINTS"]]
    assert admin == ["/healthz", "/readyz", "/metrics", "/keys/key", "/keys?state=unknown",
                     "/keys?resource=ID"], admin
    exits = [tag for tag, _ in sections["EXIT STATUS"]]
    assert exits == ["0", "1", "2"], exits
    outcomes = " ".join(tag for tag, _ in sections["DESCRIPTION"])
    for outcome in ("passthrough", "executed", "replayed", "in_flight", "mismatch",
                    "missing_key", "invalid_key", "too_large", "store_error", "upstream_error"):
        assert outcome in outcomes, "DESCRIPTION does not list the outcome %s" % outcome


def test_manpage_options_agree_with_help():
    helpopts, env_only = parse_help()
    man = man_options()
    assert len(helpopts) >= 25, helpopts  # the parser found the options
    assert set(man) == set(helpopts), (
        "only in --help: %s; only in the man page: %s"
        % (sorted(set(helpopts) - set(man)), sorted(set(man) - set(helpopts))))
    for flag, h in helpopts.items():
        m = man[flag]
        assert m["arg"] == h["arg"], "%s: man page argument %r, --help %r" % (
            flag, m["arg"], h["arg"])
        if flag in ACTIONS:
            continue
        assert m["envs"][0] == h["env"], "%s: man page environment %r, --help %r" % (
            flag, m["envs"], h["env"])
        for extra in m["envs"][1:]:
            assert extra in env_only, "%s: %s is not an environment-only variable of --help" % (
                flag, extra)
        assert m["default"] == h["default"], "%s: man page default %r, --help %r" % (
            flag, m["default"], h["default"])


def test_manpage_environment_agrees_with_help():
    _, env_only = parse_help()
    assert env_only, "--help lists no environment-only variable"
    entries = dict(parse_manpage()["ENVIRONMENT"])
    assert "IDEMPROXY_NAME" in entries
    for name, default in env_only.items():
        assert name in entries, "man page ENVIRONMENT does not list %s" % name
        m = re.search(r"Default: (\S+?)\.(?:\s|$)", entries[name])
        assert (m.group(1) if m else None) == default, "%s: man page default %r, --help %r" % (
            name, m and m.group(1), default)


def test_readme_options_agree_with_help():
    helpopts, env_only = parse_help()
    rows = readme_options()
    by_flag = {}
    env_rows = {}
    for flags, arg, envs, default in rows:
        if not flags:
            assert len(envs) == 1, "README row with neither option nor one variable: %r" % envs
            env_rows[envs[0]] = default
        for flag in flags:
            assert flag not in by_flag, "README lists %s twice" % flag
            by_flag[flag] = (arg, envs, default)
    assert set(by_flag) == set(helpopts), (
        "only in --help: %s; only in README: %s"
        % (sorted(set(helpopts) - set(by_flag)), sorted(set(by_flag) - set(helpopts))))
    for flag, h in helpopts.items():
        if flag in ACTIONS:
            continue
        arg, envs, default = by_flag[flag]
        assert arg == h["arg"], "%s: README argument %r, --help %r" % (flag, arg, h["arg"])
        assert envs and envs[0] == h["env"], "%s: README environment %r, --help %r" % (
            flag, envs, h["env"])
        for extra in envs[1:]:
            assert extra in env_only, "%s: README names %s, not a variable of --help" % (
                flag, extra)
        readme_default = README_PROSE_DEFAULTS.get(default, default)
        assert readme_default == h["default"], "%s: README default %r, --help %r" % (
            flag, default, h["default"])
    listed = {e for _, _, envs, _ in rows for e in envs}
    for name, default in env_only.items():
        assert name in listed, "README's options table does not name %s" % name
        if name in env_rows:
            assert env_rows[name] == default, "%s: README default %r, --help %r" % (
                name, env_rows[name], default)


def test_readme_and_manpage_name_the_same_variables():
    """The variables beyond the first (IDEMPOTENCY_DEFAULT_TTL_SEC for --ttl)
    are not printed by --help next to the option: README and man page agree."""
    man = man_options()
    readme = {f: envs for flags, _, envs, _ in readme_options() for f in flags}
    for flag, m in man.items():
        if flag in ACTIONS:
            continue
        assert m["envs"] == readme[flag], "%s: man page %r, README %r" % (
            flag, m["envs"], readme[flag])


def readme_section(title):
    """The text of README's section (## or ###) <title>, up to the next one of its level or above."""
    with open(README) as f:
        text = f.read()
    m = re.search(r"^(#+) %s\n" % re.escape(title), text, re.M)
    assert m, "README has no section %r" % title
    level = len(m.group(1))
    end = re.search(r"^#{1,%d} " % level, text[m.end():], re.M)
    return text[m.end():m.end() + end.start()] if end else text[m.end():]


def test_readme_configuration_examples_are_valid(tmp_path):
    """Every YAML example of README's Configuration file section, and the
    shipped example files, pass --check-config; the broken example fails with
    exactly the lines README shows."""
    blocks = re.findall(r"```yaml\n(.*?)```", readme_section("Configuration file"), re.S)
    assert len(blocks) >= 6, blocks
    pki = None
    for i, block in enumerate(blocks):
        upstream = "http://127.0.0.1:3000"
        if "/etc/idemproxy/" in block and (".crt" in block or ".key" in block):
            # The TLS recipe: its files made here (--check-config loads them).
            pki = pki or make_pki(str(tmp_path / "pki"))
            for name, real in (("proxy.crt", pki.server_crt), ("proxy.key", pki.server_key),
                               ("internal-ca.crt", pki.ca_crt), ("client.crt", pki.client_crt),
                               ("client.key", pki.client_key)):
                block = block.replace("/etc/idemproxy/" + name, real)
            upstream = "https://127.0.0.1:3000"
        path = tmp_path / ("readme%d.yaml" % i)
        path.write_text(block)
        r = run_binary(["--config", str(path), "--upstream", upstream, "--check-config"])
        assert r.returncode == 0, (block, r.stderr.decode())
        assert r.stdout.decode().startswith("idemproxy: the configuration is valid (")
    for example in ("idemproxy.yaml", "demo.yaml"):
        r = run_binary(["--config", os.path.join(REPO, "examples", example), "--upstream",
                        "http://127.0.0.1:3000", "--check-config"])
        assert r.returncode == 0, (example, r.stderr.decode())

    shown = re.search(r"```\n\$ cat bad.yaml\n(.*?)\$ idemproxy --config bad.yaml --check-config\n"
                      r"(.*?)```", readme_section("Problems"), re.S)
    assert shown, "README's Problems section shows no broken file and its output"
    (tmp_path / "bad.yaml").write_text(shown.group(1))
    r = subprocess.run([os.path.abspath(IDEMPROXY_BIN), "--config", "bad.yaml", "--check-config"],
                       cwd=str(tmp_path), env=clean_env(), capture_output=True, timeout=10,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert r.stderr.decode() == shown.group(2), r.stderr.decode()
