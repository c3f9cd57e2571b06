"""Certificates for the fleet figures: Puppet-style RSA 4,096 ssldirs made with the `openssl` CLI.

Puppet's CA issues RSA keys of `keylength` = 4,096 bits by default, for itself, the server and every
node, signed with SHA-256; its certificates carry `basicConstraints CA:FALSE`, key usage
digitalSignature + keyEncipherment and both serverAuth and clientAuth extended key usages. The ssldirs
written here use Puppet's layout, as `pluginsync-master dev-certs` does (docs/protocol.md §5.3):

  DIR/ca/ca_key.pem  DIR/certs/ca.pem  DIR/crl.pem
  DIR/certs/<name>.pem  DIR/private_keys/<name>.pem   (localhost: the master, bench-node: the node)

`puppet_rsa(dir)` makes the CA, the master (`localhost`, SANs localhost and 127.0.0.1) and the node,
all RSA 4,096. `p256_master(rsa_dir, dir)` copies that ssldir and replaces only the master's key by
an ECDSA P-256 key issued by the same RSA CA: the cheap option for a master whose CA is Puppet's.
Imported by bench/fleet.py; stdlib and the `openssl` CLI only.
"""
import os, shutil, subprocess

SERVER = "localhost"
NODE = "bench-node"

LEAF_EXT = """[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
nsComment = "Puppet Server Internal Certificate"
{san}
"""

CA_CNF = """[ca]
default_ca = puppet_ca
[puppet_ca]
database = {d}/ca/inventory.txt
crlnumber = {d}/ca/crlnumber
certificate = {d}/certs/ca.pem
private_key = {d}/ca/ca_key.pem
default_md = sha256
default_crl_days = 3650
[req]
distinguished_name = dn
[dn]
"""


def _openssl(*args):
    r = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: openssl {args[0]} failed: {r.stderr.strip()}")


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _rsa_key(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # PKCS#1 ("BEGIN RSA PRIVATE KEY"), as Puppet writes its keys.
    _openssl("genrsa", "-traditional", "-out", path, "4096")
    os.chmod(path, 0o600)


def _p256_key(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    os.chmod(path, 0o600)


def _issue(d, name, san):
    """Signs private_keys/<name>.pem's public key with the CA as a Puppet leaf certificate."""
    csr = os.path.join(d, "ca", f"{name}.csr")
    ext = os.path.join(d, "ca", f"{name}.ext")
    _write(ext, LEAF_EXT.format(san=f"subjectAltName = {san}" if san else ""))
    _openssl("req", "-new", "-key", os.path.join(d, "private_keys", f"{name}.pem"), "-subj", f"/CN={name}",
             "-out", csr)
    _openssl("x509", "-req", "-in", csr, "-CA", os.path.join(d, "certs", "ca.pem"),
             "-CAkey", os.path.join(d, "ca", "ca_key.pem"), "-CAserial", os.path.join(d, "ca", "serial"), "-CAcreateserial", "-sha256", "-days", "1825",
             "-extfile", ext, "-extensions", "leaf", "-out", os.path.join(d, "certs", f"{name}.pem"))


def puppet_rsa(d):
    """A Puppet-style ssldir in d: RSA 4,096 CA, master and node, and an empty CRL."""
    d = os.path.abspath(d)
    for sub in ("ca", "certs", "private_keys"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    _rsa_key(os.path.join(d, "ca", "ca_key.pem"))
    _openssl("req", "-x509", "-new", "-key", os.path.join(d, "ca", "ca_key.pem"), "-sha256", "-days", "3650",
             "-subj", f"/CN=Puppet CA: {SERVER}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash",
             "-out", os.path.join(d, "certs", "ca.pem"))
    _rsa_key(os.path.join(d, "private_keys", f"{SERVER}.pem"))
    _issue(d, SERVER, f"DNS:{SERVER},IP:127.0.0.1")
    _rsa_key(os.path.join(d, "private_keys", f"{NODE}.pem"))
    _issue(d, NODE, None)
    cnf = os.path.join(d, "ca", "openssl.cnf")
    _write(cnf, CA_CNF.format(d=d))
    _write(os.path.join(d, "ca", "inventory.txt"), "")
    _write(os.path.join(d, "ca", "crlnumber"), "01\n")
    _openssl("ca", "-gencrl", "-config", cnf, "-out", os.path.join(d, "crl.pem"))
    return d


def p256_master(rsa_dir, d):
    """rsa_dir's CA and node, with the master's key replaced by a P-256 key the RSA CA signs."""
    d = os.path.abspath(d)
    shutil.copytree(rsa_dir, d)
    os.remove(os.path.join(d, "private_keys", f"{SERVER}.pem"))
    _p256_key(os.path.join(d, "private_keys", f"{SERVER}.pem"))
    _issue(d, SERVER, f"DNS:{SERVER},IP:127.0.0.1")
    return d


def describe(d, name):
    """`openssl x509 -noout -text`'s key line for a certificate, e.g. 'Public-Key: (4096 bit)'."""
    r = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", os.path.join(d, "certs", f"{name}.pem")],
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if "Public Key Algorithm" in line:
            alg = line.split(":", 1)[1].strip()
        if "Public-Key:" in line:
            return f"{alg} {line.strip().split(':', 1)[1].strip()}"
    return "?"


if __name__ == "__main__":
    import sys, tempfile
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="bench-certs-")
    puppet_rsa(os.path.join(out, "rsa"))
    p256_master(os.path.join(out, "rsa"), os.path.join(out, "rsa-p256"))
    for k in ("rsa", "rsa-p256"):
        print(k, describe(os.path.join(out, k), SERVER), describe(os.path.join(out, k), NODE))
