//! Machines for multi-node tests, on this one: each node a Linux network namespace of its own
//! with one interface, all of them on a bridge in a hub namespace, so that nodes reach each
//! other by address and a test cuts or heals each node's link as a real network would fail,
//! without touching the host's own network. (Delays, loss and reordering are the seeded
//! simulation's: this machine's kernel has no netem.)
//!
//! Needs root and `ip` (iproute2). Without them a test panics with a
//! clear message rather than passing silently. Names carry the test process's id, and a new
//! network first removes what a test process that died left behind.

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Networks made by this process so far: each gets a subnet and names of its own.
static NETWORKS_MADE: AtomicU32 = AtomicU32::new(0);

/// Where `ip netns` keeps its namespaces.
const NETNS_DIRECTORY: &str = "/run/netns";
/// Every namespace a test makes starts with this, then the process id.
const NAME_PREFIX: &str = "rpt-";

/// A network of `nodes` namespaces. Dropping it removes them all (and their links).
pub struct Network {
    hub: String,
    nodes: Vec<String>,
    addresses: Vec<Ipv4Addr>,
}

fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|directory| Path::new(directory).join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Runs `ip` (or `tc`) with `args`; panics with what it said when it fails.
fn run(program: &str, args: &[&str]) {
    let output = Command::new(tool(program))
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program} {args:?} (needs root and iproute2): {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}): {}{} (multi-node tests need root and iproute2)",
        output.status,
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// Removes the namespaces of test processes that are gone (killed before their drop ran).
fn remove_leftovers() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIRECTORY) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|pid| pid.parse::<i32>().ok()) else { continue };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive {
            let _ = Command::new(tool("ip")).args(["netns", "del", &name]).output();
        }
    }
}

impl Network {
    /// Makes `nodes` namespaces on one bridge, node `i` at address `10.S.N.(i+1)`, each with
    /// its loopback up.
    pub fn new(nodes: usize) -> Network {
        assert!((1..=200).contains(&nodes), "{nodes} nodes: a network has 1 to 200");
        remove_leftovers();
        let pid = std::process::id();
        let index = NETWORKS_MADE.fetch_add(1, Ordering::Relaxed);
        // A subnet of its own per network of this process, and per process (most likely):
        // the namespaces are separate, so overlap would only confuse a reader of the logs.
        let subnet = [10, 100 + (pid % 100) as u8, (index % 256) as u8];
        let hub = format!("{NAME_PREFIX}{pid}-{index}-hub");
        run("ip", &["netns", "add", &hub]);
        let mut network = Network { hub, nodes: Vec::new(), addresses: Vec::new() };
        run("ip", &["-n", &network.hub, "link", "set", "lo", "up"]);
        run("ip", &["-n", &network.hub, "link", "add", "bridge", "type", "bridge"]);
        run("ip", &["-n", &network.hub, "link", "set", "bridge", "up"]);
        for node in 0..nodes {
            let name = format!("{NAME_PREFIX}{pid}-{index}-node{node}");
            run("ip", &["netns", "add", &name]);
            network.nodes.push(name.clone());
            let address = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], node as u8 + 1);
            network.addresses.push(address);
            let port = format!("port{node}");
            run("ip", &["-n", &name, "link", "set", "lo", "up"]);
            run(
                "ip",
                &[
                    "-n",
                    &network.hub,
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &name,
                ],
            );
            run("ip", &["-n", &network.hub, "link", "set", &port, "master", "bridge", "up"]);
            run("ip", &["-n", &name, "addr", "add", &format!("{address}/24"), "dev", "eth0"]);
            run("ip", &["-n", &name, "link", "set", "eth0", "up"]);
        }
        network
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `node`'s address on the network.
    pub fn address(&self, node: usize) -> Ipv4Addr {
        self.addresses[node]
    }

    /// The name of node `node`'s namespace (for `ip netns exec`).
    pub fn namespace(&self, node: usize) -> &str {
        &self.nodes[node]
    }

    /// A command that runs `program` inside node `node`.
    pub fn command(&self, node: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(tool("ip"));
        command.args(["netns", "exec", &self.nodes[node]]).arg(program);
        command
    }

    /// Runs `work` on a thread of its own inside node `node` (sockets it makes stay there).
    pub fn in_node<R: Send + 'static>(&self, node: usize, work: impl FnOnce() -> R + Send + 'static) -> R {
        let path = Path::new(NETNS_DIRECTORY).join(&self.nodes[node]);
        std::thread::spawn(move || {
            let namespace =
                std::fs::File::open(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            nix::sched::setns(namespace.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|error| panic!("entering {}: {error}", path.display()));
            work()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Cuts node `node` off from every other: its link to the bridge goes down.
    pub fn isolate(&self, node: usize) {
        run("ip", &["-n", &self.hub, "link", "set", &format!("port{node}"), "down"]);
    }

    /// Brings node `node`'s link back.
    pub fn heal(&self, node: usize) {
        run("ip", &["-n", &self.hub, "link", "set", &format!("port{node}"), "up"]);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // A node's namespace takes its end of the link with it, and the hub's end goes too.
        for name in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = Command::new(tool("ip")).args(["netns", "del", name]).output();
        }
    }
}
