"""The artifact-signing commands of the ``deploy`` command line (``cli.py`` adds them):

    deploy keygen KEY.pem [--public KEY.pub.pem]
    deploy sign ARTIFACT --key KEY.pem [-o OUT]
    deploy verify ARTIFACT [--trusted-key KEY.pub.pem ...]

They use the runtime only (``runtime/signing.py``; the ``cryptography`` package for keys).
See docs/reliability.md.
"""
from __future__ import annotations

from pathlib import Path


def add_commands(sub, common) -> None:
    k = sub.add_parser("keygen", parents=[common],
                       help="make an Ed25519 key pair for signing artifacts")
    k.add_argument("key", help="private key file to write (PEM, mode 0600; never overwritten)")
    k.add_argument("--public", help="public key file (default: KEY's stem + .pub.pem)")
    k.set_defaults(func=cmd_keygen)

    s = sub.add_parser("sign", parents=[common],
                       help="sign an artifact's manifest with an Ed25519 private key")
    s.add_argument("artifact")
    s.add_argument("--key", required=True, help="private key (PEM: deploy keygen, or openssl "
                                                "genpkey -algorithm ed25519)")
    s.add_argument("-o", "--output", help="write the signed artifact here (default: in place)")
    s.set_defaults(func=cmd_sign)

    v = sub.add_parser("verify", parents=[common],
                       help="check an artifact's integrity (and signature) without running it")
    v.add_argument("artifact")
    v.add_argument("--trusted-key", action="append", default=[], metavar="KEY.pub.pem",
                   help="require a valid signature by this public key (repeatable: any one)")
    v.set_defaults(func=cmd_verify)


def cmd_keygen(args) -> int:
    from .runtime.signing import generate_key, short
    key = Path(args.key)
    public = Path(args.public) if args.public else key.with_name(
        key.name.removesuffix(".pem") + ".pub.pem")
    fp = generate_key(key, public)
    print(f"wrote private key {key} (keep it secret) and public key {public} "
          f"(fingerprint {short(fp)}); sign with: deploy sign ARTIFACT --key {key}")
    return 0


def cmd_sign(args) -> int:
    from .runtime.signing import short, sign_artifact
    path, fp, count = sign_artifact(args.artifact, args.key, args.output)
    print(f"signed {path} with key {short(fp)} ({count} signature{'s' * (count != 1)}); load "
          "it with deploy.load(path, trusted_keys=[PUBLIC_KEY])")
    return 0


def cmd_verify(args) -> int:
    from .runtime.artifact import read_artifact
    from .runtime.signing import short
    contents = read_artifact(args.artifact, args.trusted_key or None)
    m = contents.manifest
    how = (f"signed by trusted key {short(contents.signed_by)}" if contents.signed_by else
           "signatures present, not checked (give --trusted-key)" if contents.signatures else
           "not signed")
    print(f"{args.artifact}: ok (format {m['format_version']}, deploy "
          f"{m.get('deploy_version', '?')}, {len(contents.members)} members verified; {how})")
    return 0
