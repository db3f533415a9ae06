//! A cluster of real `ringpostd` nodes on this machine: each a `Daemon` in its own directory,
//! started with `--node-id` and the same `--cluster` list, its router and forwarders on ports
//! chosen here (so that a node keeps its addresses across restarts, as a deployed node does).

use crate::Daemon;
use ringpost_client::{block_on, Client, ClusterStatusResponse, PoolSettings};
use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a cluster's nodes may take to all serve: each waits for the catalog's leader,
/// which needs a quorum of them started.
pub const CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `Cluster::leader` waits for the running nodes to agree on a running leader.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `cluster status` request may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// Starts given up on when a node found a chosen port taken (by another process, between
/// the choice and its bind), each with new ports.
const START_ATTEMPTS: usize = 3;

/// Ports handed to clusters of this test process that are still alive: tests run on threads
/// beside each other, and a node that is down must find its ports free when it restarts.
static PORTS_IN_USE: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Where this process picks ports: below the kernel's ephemeral range when there is room
/// (the ports `127.0.0.1:0` and outgoing connections take, which could take a down node's
/// port before it restarts); otherwise anywhere, as port 0 would.
fn port_range() -> std::ops::Range<u32> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|low| low.parse::<u32>().ok()));
    match low {
        Some(low) if low >= 12_000 => 10_000..low,
        _ => 1024..65_536,
    }
}

/// The ports of one node: the router's (its forwarders' follow it) and the cluster port.
struct NodePorts {
    router: u16,
    cluster: u16,
}

/// Picks `nodes` × (router, `shards` forwarders after it, cluster port), every one bound for a
/// moment here so that it is free, none shared with a live cluster of this process.
fn pick_ports(nodes: usize, shards: usize) -> Vec<NodePorts> {
    let range = port_range();
    let mut state = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
        ^ (u64::from(std::process::id()) << 32)
        | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        range.start + (state % u64::from(range.end - range.start)) as u32
    };
    let mut registry = PORTS_IN_USE.lock().unwrap();
    let taken = registry.get_or_insert_with(HashSet::new);
    // Held until every port is chosen, so that no two choices coincide.
    let mut held = Vec::new();
    let mut take_run = |count: usize, taken: &mut HashSet<u16>| -> u16 {
        for _ in 0..10_000 {
            let first = next();
            if first + count as u32 > 65_535 {
                continue;
            }
            let ports: Vec<u16> = (first..first + count as u32).map(|port| port as u16).collect();
            if ports.iter().any(|port| taken.contains(port)) {
                continue;
            }
            let listeners: Option<Vec<TcpListener>> =
                ports.iter().map(|port| TcpListener::bind(("127.0.0.1", *port)).ok()).collect();
            if let Some(listeners) = listeners {
                held.extend(listeners);
                taken.extend(&ports);
                return ports[0];
            }
        }
        panic!("found no {count} free ports in a row");
    };
    (0..nodes)
        .map(|_| {
            let router = take_run(1 + shards, taken);
            let cluster = take_run(1, taken);
            NodePorts { router, cluster }
        })
        .collect()
}

fn release_ports(ports: &[u16]) {
    if let Some(taken) = PORTS_IN_USE.lock().unwrap().as_mut() {
        for port in ports {
            taken.remove(port);
        }
    }
}

/// The value of `flag` in `args`, if given.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|arg| arg == flag).and_then(|index| args.get(index + 1)).map(String::as_str)
}

/// Nodes `1..=n` of one cluster, all serving once `start` returns. Dropping it stops them all
/// (and, in a failing test, keeps their directories and prints their logs).
pub struct Cluster {
    nodes: Vec<Daemon>,
    /// Every node's cluster address, node i at index i - 1 (`--cluster`).
    pub cluster_addresses: Vec<String>,
    ports: Vec<u16>,
    /// The flags every node got, for nodes that join later.
    args: Vec<String>,
    shards: usize,
    label: String,
}

impl Cluster {
    /// Starts `nodes` nodes, each in a directory of its own and with `--shards 1 --grpc-listen
    /// off --no-pin` unless `extra_args` say otherwise, and waits until every one serves (at
    /// most `CLUSTER_START_TIMEOUT`; a failure shows every node's log).
    pub fn start(label: &str, nodes: usize, extra_args: Vec<String>) -> Cluster {
        Cluster::start_each(label, nodes, extra_args, &|_, _| {})
    }

    /// `start`, with `prepare` given each node (its id and its `Daemon`, not yet started) to
    /// set what differs between nodes, such as their environment.
    pub fn start_each(
        label: &str,
        nodes: usize,
        extra_args: Vec<String>,
        prepare: &dyn Fn(u64, &mut Daemon),
    ) -> Cluster {
        let mut args = extra_args;
        if flag_value(&args, "--shards").is_none() {
            args.extend(["--shards".to_owned(), "1".to_owned()]);
        }
        if !args.iter().any(|arg| arg == "--no-pin") {
            args.push("--no-pin".to_owned());
        }
        let shards: usize = flag_value(&args, "--shards").unwrap().parse().expect("--shards takes a number");
        for attempt in 1..=START_ATTEMPTS {
            match Cluster::try_start(label, nodes, shards, &args, prepare) {
                Ok(cluster) => return cluster,
                Err(why) if attempt < START_ATTEMPTS => {
                    eprintln!("cluster {label}: {why}; starting again on other ports")
                }
                Err(why) => panic!("cluster {label}: {why}"),
            }
        }
        unreachable!()
    }

    /// One start on newly chosen ports: `Err` only when a node could not bind a port it was
    /// given (taken since it was chosen); any other failure panics.
    fn try_start(
        label: &str,
        count: usize,
        shards: usize,
        args: &[String],
        prepare: &dyn Fn(u64, &mut Daemon),
    ) -> Result<Cluster, String> {
        let ports = pick_ports(count, shards);
        let cluster_addresses: Vec<String> =
            ports.iter().map(|node| format!("127.0.0.1:{}", node.cluster)).collect();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            cluster_addresses,
            ports: ports
                .iter()
                .flat_map(|node| (0..=shards as u16).map(|i| node.router + i).chain([node.cluster]))
                .collect(),
            args: args.to_vec(),
            shards,
            label: label.to_owned(),
        };
        let list = cluster.cluster_addresses.join(",");
        for (index, node_ports) in ports.iter().enumerate() {
            let mut node_args = args.to_vec();
            node_args.extend([
                "--node-id".to_owned(),
                (index + 1).to_string(),
                "--cluster".to_owned(),
                list.clone(),
            ]);
            let mut daemon = Daemon::prepare(&format!("{label}-node{}", index + 1), Vec::new(), node_args);
            daemon.listen_on(&format!("127.0.0.1:{}", node_ports.router));
            prepare(index as u64 + 1, &mut daemon);
            daemon.launch();
            cluster.nodes.push(daemon);
        }
        let deadline = Instant::now() + CLUSTER_START_TIMEOUT;
        let mut ready = vec![false; count];
        while ready.iter().any(|ready| !ready) {
            for (index, node) in cluster.nodes.iter_mut().enumerate() {
                if ready[index] {
                    continue;
                }
                match node.poll_ready() {
                    Ok(done) => ready[index] = done,
                    Err(status) => {
                        let log = node.log();
                        if log.contains("Address already in use") {
                            return Err(format!("node {} exited with {status}: {}", index + 1, log.trim()));
                        }
                        // Every node's log follows, as each `Daemon` is dropped.
                        panic!("node {} exited with {status} while starting", index + 1);
                    }
                }
            }
            if Instant::now() > deadline {
                let waiting: Vec<usize> = (0..count).filter(|index| !ready[*index]).map(|i| i + 1).collect();
                panic!("nodes {waiting:?} did not serve within {CLUSTER_START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(cluster)
    }

    /// Starts the next node (id n + 1) with `--join`, the members' cluster addresses and its
    /// own in `--cluster`, and the flags the others got, without waiting: it serves only once
    /// a member adds it (`ringpost cluster add-node`; then `wait_ready`). Returns its id.
    pub fn launch_joining(&mut self) -> u64 {
        self.launch_joining_without(&[])
    }

    /// `launch_joining`, its `--cluster` leaving out the nodes `gone` (removed ones), so that
    /// its id is beyond the list and its own address is the list's last.
    pub fn launch_joining_without(&mut self, gone: &[u64]) -> u64 {
        let node_ports = pick_ports(1, self.shards).pop().expect("one node's ports");
        self.ports
            .extend((0..=self.shards as u16).map(|i| node_ports.router + i).chain([node_ports.cluster]));
        self.cluster_addresses.push(format!("127.0.0.1:{}", node_ports.cluster));
        let id = self.cluster_addresses.len() as u64;
        let listed: Vec<&str> = (1..=id)
            .filter(|node| !gone.contains(node))
            .map(|node| self.cluster_addresses[(node - 1) as usize].as_str())
            .collect();
        let mut node_args = self.args.clone();
        node_args.extend([
            "--node-id".to_owned(),
            id.to_string(),
            "--cluster".to_owned(),
            listed.join(","),
            "--join".to_owned(),
        ]);
        let mut daemon = Daemon::prepare(&format!("{}-node{id}", self.label), Vec::new(), node_args);
        daemon.listen_on(&format!("127.0.0.1:{}", node_ports.router));
        // Known before it serves: a node waiting to be added answers on both meanwhile.
        daemon.address = format!("127.0.0.1:{}", node_ports.router);
        if flag_value(&self.args, "--http-listen").is_some_and(|listen| listen != "off") {
            let picked = pick_ports(1, 0).pop().expect("one node's ports");
            self.ports.extend([picked.router, picked.cluster]);
            daemon.http_address = Some(format!("127.0.0.1:{}", picked.router));
        }
        daemon.launch();
        self.nodes.push(daemon);
        id
    }

    /// Waits until node `id`, launched or restarted, serves (at most `CLUSTER_START_TIMEOUT`).
    pub fn wait_ready(&mut self, id: u64) {
        let deadline = Instant::now() + CLUSTER_START_TIMEOUT;
        loop {
            match self.node_mut(id).poll_ready() {
                Ok(true) => return,
                Ok(false) => {}
                Err(status) => panic!("node {id} exited with {status} while starting"),
            }
            assert!(Instant::now() < deadline, "node {id} did not serve within {CLUSTER_START_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node ids, 1 to n.
    /// The running node whose forwarder the routers name first for `topic`: its leader
    /// (waiting up to 30 s for one).
    pub fn topic_leader(&self, topic: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let port_of = |address: &str| -> u16 { address.rsplit(':').next().unwrap().parse().unwrap() };
        loop {
            for id in self.ids().filter(|id| self.is_running(*id)) {
                let Ok(route) = block_on(self.node(id).client().lookup_topic(topic)) else { continue };
                let Some(first) = route.first() else { continue };
                let port = port_of(first);
                let leader = self.ids().find(|candidate| {
                    let router = port_of(&self.node(*candidate).address);
                    port > router && port <= router + self.shards as u16 && self.is_running(*candidate)
                });
                if let Some(leader) = leader {
                    return leader;
                }
            }
            assert!(Instant::now() < deadline, "no running node leads {topic}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> {
        1..=self.nodes.len() as u64
    }

    /// Node `id` (from 1, as `--node-id` numbers them).
    pub fn node(&self, id: u64) -> &Daemon {
        &self.nodes[(id - 1) as usize]
    }

    /// Node `id`, to kill or restart it.
    pub fn node_mut(&mut self, id: u64) -> &mut Daemon {
        &mut self.nodes[(id - 1) as usize]
    }

    /// Whether node `id`'s process runs (it has not been killed since its last start).
    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).pid().is_some()
    }

    /// Every node's log, each under a heading. (A failing test shows them anyway: a `Daemon`
    /// dropped while its thread panics prints its log.)
    pub fn logs(&self) -> String {
        self.ids().map(|id| format!("\n--- node {id}'s log:\n{}", self.node(id).log())).collect()
    }

    /// `cluster status` as node `id` answers it (within a couple of seconds).
    pub fn status(&self, id: u64) -> Result<ClusterStatusResponse, String> {
        let address = &self.node(id).address;
        let client = block_on(Client::connect_with_timeout(address, PoolSettings::default(), STATUS_TIMEOUT))
            .map_err(|error| format!("connecting to node {id} at {address}: {error}"))?;
        block_on(client.cluster_status()).map_err(|error| format!("node {id}'s cluster status: {error}"))
    }

    /// The catalog's leader, once every running node names the same one and it runs (polls
    /// `cluster status`; at most `LEADER_TIMEOUT`).
    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            let answers = self
                .ids()
                .filter(|id| self.is_running(*id))
                .map(|id| (id, self.status(id).map(|status| status.catalog_leader)))
                .collect::<Vec<_>>();
            let named: HashSet<Option<u64>> =
                answers.iter().map(|(_, answer)| answer.clone().ok().flatten()).collect();
            if let [Some(leader)] = named.into_iter().collect::<Vec<_>>()[..] {
                if self.is_running(leader) {
                    return leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the running nodes named no common running leader within {LEADER_TIMEOUT:?}; last answers \
                 (node, leader): {answers:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Each node's own drop kills it, and keeps its directory and prints its log if the
        // test failed.
        for node in &mut self.nodes {
            node.kill();
        }
        release_ports(&self.ports);
    }
}
