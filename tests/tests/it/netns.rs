//! The multi-node tests' network (`ringpost_tests::netns`): namespaces on one bridge reach
//! each other by address, a node cut off is unreachable and reachable again once healed, and
//! a daemon run inside a node serves clients of another node.

use ringpost_client::{block_on, Client, Message};
use ringpost_tests::netns::{NetCluster, Network, READY_WITHIN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Long enough for a connect across the bridge on a loaded machine, short enough that a cut
/// link fails within the test's patience.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const PORT: u16 = 7000;

/// Whether a connection from `from` to `to`'s echo listener carries a byte there and back.
fn reaches(network: &Network, from: usize, to: usize) -> bool {
    let address = SocketAddr::from((network.address(to), PORT));
    network.in_node(from, move || {
        let Ok(mut stream) = TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) else { return false };
        stream.set_read_timeout(Some(CONNECT_TIMEOUT)).unwrap();
        let mut byte = [0u8];
        stream.write_all(b"x").is_ok() && stream.read_exact(&mut byte).is_ok() && &byte == b"x"
    })
}

/// An echo listener in `node`, on a thread that serves one byte per connection until the test
/// process ends (its namespace's removal closes it).
fn echo(network: &Network, node: usize) {
    let address = SocketAddr::from((network.address(node), PORT));
    let listener = network.in_node(node, move || TcpListener::bind(address).expect("binding in the node"));
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut byte = [0u8];
            if stream.read_exact(&mut byte).is_ok() {
                let _ = stream.write_all(&byte);
            }
        }
    });
}

#[test]
fn nodes_reach_each_other_and_an_isolated_one_is_cut_off_until_healed() {
    let network = Network::new(3);
    for node in 0..3 {
        echo(&network, node);
    }
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        assert!(reaches(&network, from, to), "node {from} does not reach node {to}");
    }
    network.isolate(1);
    assert!(!reaches(&network, 0, 1), "an isolated node is reached");
    assert!(!reaches(&network, 1, 2), "an isolated node reaches out");
    assert!(reaches(&network, 0, 2), "isolating one node cut the others apart");
    network.heal(1);
    assert!(reaches(&network, 0, 1) && reaches(&network, 1, 2), "a healed node is still cut off");
}

#[test]
fn a_daemon_inside_a_node_serves_a_client_in_another() {
    let network = Network::new(2);
    let directory = ringpost_tests::temporary_directory("netns-daemon");
    let ready = directory.join("ready");
    let listen = format!("{}:7450", network.address(1));
    let mut daemon = network
        .command(1, ringpost_tests::binary("ringpostd"))
        .args([
            "--listen",
            &listen,
            "--auth",
            "off",
            "--grpc-listen",
            "off",
            "--http-listen",
            "off",
            "--shards",
            "2",
            "--no-pin",
        ])
        .arg("--data-dir")
        .arg(directory.join("data"))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting ringpostd inside node 1");
    let started = Instant::now();
    while !ready.exists() {
        assert!(started.elapsed() < READY_WITHIN, "ringpostd inside node 1 was not ready");
        assert!(daemon.try_wait().unwrap().is_none(), "ringpostd inside node 1 exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let delivered = network.in_node(0, move || {
        let client = block_on(Client::connect(&listen)).expect("connecting across the bridge");
        ringpost_tests::create_topic_and_subscription(&client, "across", "across-sub", 10);
        block_on(client.publish("across", vec![Message::new("from node 0")])).unwrap();
        let received = block_on(client.pull("across-sub", 10, 10_000)).unwrap();
        received.iter().map(|message| String::from_utf8_lossy(&message.data).into_owned()).collect::<Vec<_>>()
    });
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(delivered, ["from node 0"]);
    let _ = std::fs::remove_dir_all(&directory);
}

/// How long a cluster may take to replace a lost catalog leader: the product promises 10 s.
const FAILOVER_WITHIN: Duration = Duration::from_secs(10);

/// What a cluster port answers a request from `from` that presents no secret.
fn answer_without_the_secret(cluster: &NetCluster, from: usize, to: usize) -> ringpost_wire::Status {
    use ringpost_wire::frame::{decode_error, encode_frame, FrameHeader};
    use ringpost_wire::messages::PeerMessage;
    let address = SocketAddr::from((cluster.network.address(to), 7460));
    cluster.network.in_node(from, move || {
        let mut stream =
            TcpStream::connect_timeout(&address, CONNECT_TIMEOUT).expect("connecting to a cluster port");
        stream.set_read_timeout(Some(CONNECT_TIMEOUT)).unwrap();
        let request = PeerMessage { bytes: Vec::new() };
        let code = ringpost_wire::Command::PeerReadIndex.code();
        stream.write_all(&encode_frame(code, 0, 1, &request)).unwrap();
        let mut header = [0u8; 16];
        stream.read_exact(&mut header).expect("an answer");
        let header = FrameHeader::decode(&header).unwrap();
        let mut body = vec![0u8; header.body_length as usize];
        stream.read_exact(&mut body).unwrap();
        assert!(header.is_error(), "a cluster port answered a stranger");
        decode_error(&body)
    })
}

#[test]
fn a_partitioned_catalog_leader_is_replaced_and_decides_nothing_until_healed() {
    let cluster = NetCluster::start("netns-cluster", 3, 0);
    let refused = answer_without_the_secret(&cluster, 0, 1);
    assert_eq!(refused.code, ringpost_wire::ErrorCode::Unauthenticated, "{refused:?}");
    let started = Instant::now();
    let first = loop {
        if let Some(leader) = cluster.leader_seen_by(0) {
            break leader;
        }
        assert!(started.elapsed() < READY_WITHIN, "no leader:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    let cut = (first - 1) as usize;
    let other = (cut + 1) % 3;
    cluster.network.isolate(cut);
    let isolated = Instant::now();
    let second = loop {
        if let Some(leader) = cluster.leader_seen_by(other).filter(|leader| *leader != first) {
            break leader;
        }
        assert!(
            isolated.elapsed() < FAILOVER_WITHIN,
            "no new leader within {FAILOVER_WITHIN:?} of cutting node {first} off:\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("node {second} leads {:.2} s after node {first} was cut off", isolated.elapsed().as_secs_f64());
    let made = cluster.cli(other, &["topic", "create", "made-by-the-majority"]);
    assert!(
        made.status.success(),
        "the majority did not take a create: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    // The node cut off cannot gather a quorum: whatever it believes, it decides nothing.
    let refused = cluster.cli(cut, &["--timeout", "5", "topic", "create", "made-by-the-minority"]);
    assert!(!refused.status.success(), "a node cut off from the others took a create");
    cluster.network.heal(cut);
    let healed = Instant::now();
    loop {
        let seen = cluster.cli(cut, &["--timeout", "2", "topic", "get", "made-by-the-majority"]);
        if seen.status.success() {
            break;
        }
        assert!(healed.elapsed() < READY_WITHIN, "the healed node never applied the majority's create");
        std::thread::sleep(Duration::from_millis(100));
    }
    for node in 0..3 {
        let listed = cluster.cli(node, &["topic", "list"]);
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert!(listed.contains("made-by-the-majority"), "node {node} lists {listed}");
        assert!(
            !listed.contains("made-by-the-minority"),
            "the minority's create survived on node {node}: {listed}"
        );
        assert_eq!(cluster.leader_seen_by(node), Some(second), "node {node} sees another leader");
    }
}
