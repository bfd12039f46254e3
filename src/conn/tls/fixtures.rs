//! Test fixtures shared by the unit tests of the TLS module: a root certificate made for
//! them, and a directory of files that is removed when the test ends.

use std::path::PathBuf;

/// A self-signed EC P-256 root signed with ecdsa-with-SHA256, made for these tests.
pub(super) const ROOT_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBnDCCAUGgAwIBAgIUSYimwUgC5X06lVNvabAkWxQoMUUwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXcG9zdHBvbmUgdW5pdCB0ZXN0IHJvb3QwIBcNMjYxMTI5MjMw
MDA0WhgPMjEyNjExMDUyMzAwMDRaMCIxIDAeBgNVBAMMF3Bvc3Rwb25lIHVuaXQg
dGVzdCByb290MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEBr3Q+zC8xwKRzmfe
HtaDl5E0cC0XNWdMZbF8werlhr3ZBtJ1IVT9qw+sx1e3jf7llAKjhyZx07RPDLBL
bBpgr6NTMFEwHQYDVR0OBBYEFBSi2aSO0A2h0w0cAabQnoe86XJuMB8GA1UdIwQY
MBaAFBSi2aSO0A2h0w0cAabQnoe86XJuMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZI
zj0EAwIDSQAwRgIhAPi9rmv351UNVt/g2VK3ddIb4/mbQLGqUci+RPSAL5fRAiEA
0gMP2xWvCTdSMEMDdRCFrN6UslmNFzxiMIfQyX/Cu4A=
-----END CERTIFICATE-----
";
/// `openssl x509 -outform DER | sha256sum` of ROOT_PEM.
pub(super) const ROOT_SHA256: &str =
    "32f877c1bdc78991da11c0e82f929fdea57aee2b788006aaa96f211c0b5aab75";

/// A directory of files for one test, removed on drop.
pub(super) struct Files(PathBuf);

impl Files {
    pub(super) fn new(test: &str) -> Files {
        let dir =
            std::env::temp_dir().join(format!("postpone-tls-unit-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Files(dir)
    }

    pub(super) fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
