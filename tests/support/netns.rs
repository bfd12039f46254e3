//! A network namespace joined to this one by a veth pair, with link-local addresses only
//! (169.254.N.x/30: the host side and the namespace side, nothing routed beyond them), so a
//! process started inside it reaches a server of ours listening on the host side's address,
//! and [`Netns::cut`] takes the link down (every connection through it goes half-open) until
//! [`Netns::heal`]. Deleted on drop. [`Netns::skip_reason`] says why namespaces cannot be made.

use std::process::Command;

/// One namespace and its veth pair.
pub struct Netns {
    name: String,
    host_if: String,
    host_ip: String,
    ns_ip: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// Why namespaces cannot be made here, or None (tries one and deletes it).
    pub fn skip_reason() -> Option<String> {
        if !super::cluster::is_root() {
            return Some("network namespaces need root (ip netns add)".into());
        }
        if !super::cluster::which("ip") {
            return Some("the ip command (iproute2) is not installed".into());
        }
        let probe = format!("pp{}probe", std::process::id() % 100_000);
        match ip(&["netns", "add", &probe]) {
            Ok(()) => {
                let _ = ip(&["netns", "del", &probe]);
                None
            }
            Err(e) => Some(format!("cannot create a network namespace: {e}")),
        }
    }

    /// The link-local /24 that namespaces of this process use: `169.254.<octet>.0/24`, the
    /// first one from the process id on that no interface of this machine uses yet (chosen
    /// once per process), so that parallel runs do not collide.
    pub fn subnet_octet() -> u32 {
        static OCTET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        *OCTET.get_or_init(|| {
            let start = std::process::id() % 200;
            (0..200)
                .map(|i| (start + i) % 200 + 20)
                .find(|octet| {
                    Command::new("ip")
                        .args(["-o", "addr", "show", "to", &format!("169.254.{octet}.0/24")])
                        .output()
                        .is_ok_and(|o| o.status.success() && o.stdout.is_empty())
                })
                .unwrap_or(start + 20)
        })
    }

    /// Namespace number `n` (0..63) of this process: `169.254.<octet>.<4n+1>` on the host
    /// side, `.<4n+2>` inside.
    pub fn create(n: u32) -> Result<Netns, String> {
        let tag = format!("{}{n}", std::process::id() % 100_000);
        let name = format!("ppns{tag}");
        let host_if = format!("pph{tag}");
        let ns_if = format!("ppn{tag}");
        let octet = Netns::subnet_octet();
        let host_ip = format!("169.254.{octet}.{}", 4 * n + 1);
        let ns_ip = format!("169.254.{octet}.{}", 4 * n + 2);
        // Leftovers of an earlier run with the same process id.
        let _ = ip(&["netns", "del", &name]);
        let _ = ip(&["link", "del", &host_if]);
        let ns = Netns {
            name,
            host_if,
            host_ip,
            ns_ip,
        };
        let exec = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns.name.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ])?;
        ip(&["link", "set", &ns_if, "netns", &ns.name])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.host_ip),
            "dev",
            &ns.host_if,
        ])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        exec(&["addr", "add", &format!("{}/30", ns.ns_ip), "dev", &ns_if])?;
        exec(&["link", "set", &ns_if, "up"])?;
        exec(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The host side's address (where a server of ours listens for this namespace).
    pub fn host_ip(&self) -> &str {
        &self.host_ip
    }

    /// The address inside the namespace.
    pub fn ns_ip(&self) -> &str {
        &self.ns_ip
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Takes the link down: packets both ways are dropped, connections go half-open.
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_if, "down"]).unwrap();
    }

    /// Brings the link back.
    pub fn heal(&self) {
        ip(&["link", "set", &self.host_if, "up"]).unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}
