"""scripts/package: the Debian package (doc/operations.md, The Debian
package). Built once here, checked by lintian (scripts/package fails on an
error), unpacked into a throwaway root with dpkg -x, and the installed
binary run from there."""
import re

import pytest

from conftest import ROOT, project_version, run, unit_settings, unpack

CONFFILES = {"/etc/idemproxy/idemproxy.yaml", "/etc/default/idemproxy"}


@pytest.fixture(scope="module")
def control(deb, tmp_path_factory):
    return unpack(deb, "-e", tmp_path_factory)


def test_lintian_reports_no_error(deb):
    report = (ROOT / "build-deb/lintian.txt").read_text()
    assert not re.search(r"^E: ", report, re.M), report


def test_the_installed_binary_says_its_version(root):
    assert run([root / "usr/bin/idemproxy", "--version"]).stdout.strip() == \
        f"idemproxy {project_version()}"


@pytest.mark.parametrize("conf", ["etc/idemproxy/idemproxy.yaml",
                                  "usr/share/doc/idemproxy/examples/payments-api.yaml"])
def test_the_installed_binary_checks_the_shipped_config(root, conf):
    p = run([root / "usr/bin/idemproxy", "--config", root / conf, "--check-config"])
    assert "the configuration is valid" in p.stdout + p.stderr


def test_the_package_holds_the_files_in_debian_s_places(deb):
    listing = run(["dpkg-deb", "-c", deb]).stdout
    files = {line.split()[-1].lstrip(".") for line in listing.splitlines()
             if not line.startswith("d")}
    for f in ("/usr/bin/idemproxy", "/usr/share/man/man1/idemproxy.1.gz",
              "/lib/systemd/system/idemproxy.service", *CONFFILES,
              "/usr/share/idemproxy/prometheus/idemproxy.rules.yml",
              "/usr/share/idemproxy/grafana/idemproxy.json", "/usr/share/doc/idemproxy/copyright",
              "/usr/share/idemproxy/postgresql/schema.sql"):
        assert f in files, f"{f} is not in the package:\n{listing}"


def test_the_configuration_files_are_conffiles(control):
    assert set((control / "conffiles").read_text().split()) == CONFFILES


def test_dependencies_come_from_shlibs(deb, root):
    """Each shared library the binary needs is named by its package in Depends."""
    depends = run(["dpkg-deb", "-f", deb, "Depends"]).stdout
    needed = re.findall(r"NEEDED\s+(\S+)",
                        run(["objdump", "-p", root / "usr/bin/idemproxy"]).stdout)
    assert len(needed) >= 6, needed
    for lib in needed:
        owner = run(["dpkg", "-S", f"*/{lib}"]).stdout.split(":")[0]
        assert re.search(rf"(^|, ){re.escape(owner)}( \(|,|$)", depends.strip()), \
            f"{lib} ({owner}) is not in Depends: {depends}"


def test_the_unit_is_enabled_on_install_and_never_started_by_the_package(control):
    postinst = (control / "postinst").read_text()
    assert "deb-systemd-helper enable 'idemproxy.service'" in postinst
    scripts = {s: (control / s).read_text() for s in ("preinst", "postinst", "prerm", "postrm")
               if (control / s).exists()}
    invoked = {s: re.findall(r"deb-systemd-invoke\s+(?:\$\S+\s+)?(\S+)", t)
               for s, t in scripts.items()}
    # An upgrade neither stops nor restarts a running proxy; removal stops it.
    assert {s: v for s, v in invoked.items() if v} == {"prerm": ["stop"]}, invoked
    assert re.search(r'"\$1" = remove .*\n\s*deb-systemd-invoke stop idemproxy\.service',
                     scripts["prerm"])


def test_the_packaged_unit_is_the_installed_one_with_debian_s_paths(root):
    unit = (root / "lib/systemd/system/idemproxy.service").read_text()
    template = (ROOT / "contrib/systemd/idemproxy.service.in").read_text()
    assert unit == template.replace("@BINDIR@", "/usr/bin").replace(
        "@CONFIG@", "/etc/idemproxy/idemproxy.yaml")
    assert ("ExecStart", "/usr/bin/idemproxy") in unit_settings(unit)


def test_the_package_version_is_meson_s(deb):
    assert run(["dpkg-deb", "-f", deb, "Version"]).stdout.strip() == project_version()

