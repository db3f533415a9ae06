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

    /// Starts `work` on a thread of its own inside node `node` (threads it starts stay there
    /// too), and returns its handle.
    pub fn spawn_in_node<R: Send + 'static>(
        &self,
        node: usize,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        let path = Path::new(NETNS_DIRECTORY).join(&self.nodes[node]);
        std::thread::spawn(move || {
            let namespace =
                std::fs::File::open(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            nix::sched::setns(namespace.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|error| panic!("entering {}: {error}", path.display()));
            work()
        })
    }

    /// Runs `work` on a thread of its own inside node `node` (sockets it makes stay there).
    pub fn in_node<R: Send + 'static>(&self, node: usize, work: impl FnOnce() -> R + Send + 'static) -> R {
        self.spawn_in_node(node, work).join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
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

/// How long a daemon inside a node may take to be ready (a debug build beside other tests).
pub const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);
/// The port each node's router listens on (its forwarders take the ones after it).
pub const ROUTER_PORT: u16 = 7450;
/// The port each node's cluster (catalog) listener takes.
pub const CLUSTER_PORT: u16 = 7460;

/// A cluster of `voters` real daemons, each in a namespace of its own, beside `clients` more
/// namespaces holding nothing but the tests' clients (so that a node cut off is cut off from
/// them too). Each node's daemon can be killed, restarted, stopped and continued.
pub struct NetCluster {
    pub network: Network,
    daemons: Vec<Option<std::process::Child>>,
    voters: usize,
    /// Data directories per node (M): a publish is durable on a majority of them.
    directories: usize,
    /// Forwarder shards per node: a topic of N sources of R replicas needs N × R in all.
    shards: usize,
    directory: PathBuf,
}

impl NetCluster {
    pub fn start(label: &str, voters: usize, clients: usize) -> NetCluster {
        NetCluster::start_with_directories(label, voters, clients, 1)
    }

    /// Like `start`, each node with `directories` data directories.
    pub fn start_with_directories(
        label: &str,
        voters: usize,
        clients: usize,
        directories: usize,
    ) -> NetCluster {
        NetCluster::start_with_shards(label, voters, clients, directories, 1)
    }

    /// Like `start_with_directories`, each node with `shards` forwarder shards (their ports
    /// follow its router's).
    pub fn start_with_shards(
        label: &str,
        voters: usize,
        clients: usize,
        directories: usize,
        shards: usize,
    ) -> NetCluster {
        let network = Network::new(voters + clients);
        let directory = crate::temporary_directory(label);
        std::fs::write(
            directory.join("cluster-secret"),
            "rpt_a-test-secret-of-the-clusters-nodes-0123456789\n",
        )
        .unwrap();
        let daemons = (0..voters).map(|_| None).collect();
        let mut cluster = NetCluster { network, daemons, voters, directories, shards, directory };
        for node in 0..voters {
            cluster.spawn(node);
        }
        let started = std::time::Instant::now();
        while !(0..voters).all(|node| cluster.directory.join(format!("ready-{node}")).exists()) {
            assert!(started.elapsed() < READY_WITHIN, "the cluster was not ready:\n{}", cluster.logs());
            for node in 0..voters {
                let exited = cluster.daemons[node].as_mut().and_then(|daemon| daemon.try_wait().unwrap());
                assert!(exited.is_none(), "node {node} exited ({exited:?}):\n{}", cluster.logs());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        cluster
    }

    /// The nodes that run daemons (the others hold clients).
    pub fn voters(&self) -> usize {
        self.voters
    }

    /// Node `node`'s router address.
    pub fn router(&self, node: usize) -> String {
        format!("{}:{ROUTER_PORT}", self.network.address(node))
    }

    /// The address of node `node`'s forwarder shard `shard`.
    pub fn forwarder(&self, node: usize, shard: usize) -> String {
        format!("{}:{}", self.network.address(node), ROUTER_PORT as usize + 1 + shard)
    }

    /// The node whose address `address` (`ip:port`) names, if it is one of the daemons'.
    pub fn node_of(&self, address: &str) -> Option<usize> {
        let ip: Ipv4Addr = address.rsplit_once(':')?.0.parse().ok()?;
        (0..self.voters).find(|node| self.network.address(*node) == ip)
    }

    /// Starts node `node`'s daemon on its data directory (again, after a kill); its standard
    /// error goes on at the end of its log.
    pub fn spawn(&mut self, node: usize) {
        assert!(self.daemons[node].is_none(), "node {node} already runs");
        let cluster: Vec<String> =
            (0..self.voters).map(|node| format!("{}:{CLUSTER_PORT}", self.network.address(node))).collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.directory.join(format!("node-{node}.log")))
            .unwrap();
        let ready = self.directory.join(format!("ready-{node}"));
        let _ = std::fs::remove_file(&ready);
        let daemon = self
            .network
            .command(node, crate::binary("ringpostd"))
            .args(["--listen", &self.router(node), "--cluster", &cluster.join(",")])
            .args(["--node-id", &(node + 1).to_string()])
            .args([
                "--auth",
                "off",
                "--grpc-listen",
                "off",
                "--http-listen",
                "off",
                "--shards",
                &self.shards.to_string(),
                "--no-pin",
            ])
            .args((0..self.directories).flat_map(|copy| {
                [
                    std::ffi::OsString::from("--data-dir"),
                    self.directory.join(format!("data-{node}-{copy}")).into(),
                ]
            }))
            .arg("--ready-file")
            .arg(ready)
            .arg("--cluster-secret-file")
            .arg(self.directory.join("cluster-secret"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting ringpostd inside a node");
        self.daemons[node] = Some(daemon);
    }

    pub fn is_running(&self, node: usize) -> bool {
        self.daemons[node].is_some()
    }

    /// Sends `signal` to node `node`'s daemon (`ip netns exec` execs it: the child is the
    /// daemon itself).
    pub fn signal(&self, node: usize, signal: nix::sys::signal::Signal) {
        let daemon = self.daemons[node].as_ref().expect("the node runs");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), signal).unwrap();
    }

    /// SIGKILL: the node loses whatever it had not written.
    pub fn kill(&mut self, node: usize) {
        if let Some(mut daemon) = self.daemons[node].take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }

    pub fn logs(&self) -> String {
        (0..self.voters)
            .map(|node| {
                let log = std::fs::read_to_string(self.directory.join(format!("node-{node}.log")))
                    .unwrap_or_default();
                format!("--- node {node} ---\n{log}")
            })
            .collect()
    }

    /// `ringpost` run inside `node` against that node's router.
    pub fn cli(&self, node: usize, args: &[&str]) -> std::process::Output {
        self.network
            .command(node, crate::binary("ringpost"))
            .args(["--server", &self.router(node)])
            .args(args)
            .output()
            .expect("running ringpost inside a node")
    }

    /// The catalog's leader as `node` sees it (node ids from 1), if it knows one.
    pub fn leader_seen_by(&self, node: usize) -> Option<u64> {
        let output = self.cli(node, &["--timeout", "2", "cluster", "status"]);
        let header = String::from_utf8_lossy(&output.stdout).lines().next()?.to_owned();
        let marker = "\"catalog_leader\":";
        let start = header.find(marker)? + marker.len();
        header[start..].split([',', '}']).next()?.trim().parse().ok()
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        for node in 0..self.voters {
            if let Some(daemon) = &self.daemons[node] {
                // A stopped process takes SIGKILL all the same; continuing it first is harmless.
                let pid = nix::unistd::Pid::from_raw(daemon.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            }
            self.kill(node);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.directory);
        }
    }
}
