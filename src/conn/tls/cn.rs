//! The certificate name check libpq does and webpki does not: a certificate without a
//! subjectAltName extension names its host in the subject's common name (CN).
//!
//! Owns a minimal DER reader, enough to find the subject's first CN and whether the
//! certificate has a subjectAltName extension, and the comparison of a CN with the host
//! (case-insensitive, with a leading `*.` wildcard for one label, as libpq). Anything it
//! cannot read counts as "no CN": the certificate is then refused as before.

use std::net::IpAddr;

use rustls::pki_types::ServerName;

/// OID 2.5.4.3, commonName.
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
/// OID 2.5.29.17, subjectAltName.
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

/// The first CN of the subject of a DER certificate that has no subjectAltName; `None` when
/// it has one, has no CN, or cannot be read.
pub(super) fn cn_without_san(der: &[u8]) -> Option<String> {
    let (_, cert) = Reader(der).expect(0x30)?;
    let (_, tbs) = Reader(cert).expect(0x30)?;
    let mut tbs = Reader(tbs);
    if tbs.peek() == Some(0xa0) {
        tbs.next()?; // version
    }
    tbs.expect(0x02)?; // serial
    tbs.expect(0x30)?; // signature algorithm
    tbs.expect(0x30)?; // issuer
    tbs.expect(0x30)?; // validity
    let (_, subject) = tbs.expect(0x30)?;
    tbs.expect(0x30)?; // subject public key
    while let Some((tag, content)) = tbs.next() {
        if tag == 0xa3 && has_san(content)? {
            return None;
        }
    }
    first_cn(subject)
}

fn has_san(extensions: &[u8]) -> Option<bool> {
    let (_, list) = Reader(extensions).expect(0x30)?;
    let mut list = Reader(list);
    while let Some((_, ext)) = list.next() {
        let (_, oid) = Reader(ext).expect(0x06)?;
        if oid == OID_SAN {
            return Some(true);
        }
    }
    Some(false)
}

fn first_cn(subject: &[u8]) -> Option<String> {
    let mut rdns = Reader(subject);
    while let Some((_, set)) = rdns.next() {
        let mut attrs = Reader(set);
        while let Some((_, attr)) = attrs.next() {
            let mut attr = Reader(attr);
            let (_, oid) = attr.expect(0x06)?;
            if oid != OID_CN {
                continue;
            }
            let (tag, value) = attr.next()?;
            return match tag {
                // UTF8String, PrintableString, IA5String, TeletexString (read as Latin-1
                // would be more exact; ASCII names are the same either way)
                0x0c | 0x13 | 0x16 | 0x14 => std::str::from_utf8(value).ok().map(str::to_owned),
                // BMPString: UTF-16BE
                0x1e => {
                    let units: Vec<u16> = value
                        .chunks_exact(2)
                        .map(|c| u16::from_be_bytes([c[0], c[1]]))
                        .collect();
                    String::from_utf16(&units).ok()
                }
                _ => None,
            };
        }
    }
    None
}

/// Whether a CN names `host`, as libpq compares them: case-insensitive, a `*.` first label
/// standing for exactly one label of a host name; an address host must equal the CN.
pub(super) fn cn_matches(cn: &str, host: &ServerName<'_>) -> bool {
    if cn.contains('\0') {
        return false;
    }
    match host {
        ServerName::DnsName(name) => {
            let name = name.as_ref().trim_end_matches('.');
            let cn = cn.trim_end_matches('.');
            if cn.eq_ignore_ascii_case(name) {
                return true;
            }
            match (cn.strip_prefix("*."), name.split_once('.')) {
                (Some(suffix), Some((first, rest))) => {
                    !first.is_empty() && !suffix.is_empty() && rest.eq_ignore_ascii_case(suffix)
                }
                _ => false,
            }
        }
        ServerName::IpAddress(ip) => cn.parse::<IpAddr>().is_ok_and(|c| c == IpAddr::from(*ip)),
        _ => false,
    }
}

/// A DER reader over one level of nesting.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next element: its tag and its content.
    fn next(&mut self) -> Option<(u8, &'a [u8])> {
        let tag = *self.0.first()?;
        let first = *self.0.get(1)? as usize;
        let (len, header) = if first < 0x80 {
            (first, 2)
        } else {
            let n = first & 0x7f;
            if n == 0 || n > 4 {
                return None;
            }
            let bytes = self.0.get(2..2 + n)?;
            (
                bytes.iter().fold(0usize, |acc, b| (acc << 8) | *b as usize),
                2 + n,
            )
        };
        let content = self.0.get(header..header.checked_add(len)?)?;
        self.0 = &self.0[header + len..];
        Some((tag, content))
    }

    /// The next element, which must have `tag`.
    fn expect(&mut self, tag: u8) -> Option<(u8, &'a [u8])> {
        self.next().filter(|(t, _)| *t == tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(name: &str) -> ServerName<'static> {
        ServerName::try_from(name.to_owned()).unwrap()
    }

    #[test]
    fn cn_comparison_follows_libpq() {
        assert!(cn_matches("db.example", &dns("DB.Example")));
        assert!(cn_matches("*.example", &dns("db.example")));
        assert!(!cn_matches("*.example", &dns("a.db.example")));
        assert!(!cn_matches("*.example", &dns("example")));
        assert!(!cn_matches("other.example", &dns("db.example")));
        assert!(cn_matches("127.0.0.1", &dns("127.0.0.1")));
        assert!(!cn_matches("db\0.example", &dns("db.example")));
    }

    #[test]
    fn the_cn_of_a_certificate_without_san_is_read() {
        // The fixtures' root has no SAN; a truncated one cannot be read.
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(
            super::super::fixtures::ROOT_PEM.as_bytes(),
        )
        .unwrap();
        assert_eq!(
            cn_without_san(der.as_ref()).as_deref(),
            Some("postpone unit test root")
        );
        assert_eq!(cn_without_san(&der.as_ref()[..40]), None);
    }
}
