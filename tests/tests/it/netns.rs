//! The multi-node tests' network (`ringpost_tests::netns`): namespaces on one bridge reach
//! each other by address, a node cut off is unreachable and reachable again once healed, and
//! a daemon run inside a node serves clients of another node.

use ringpost_client::{block_on, Client, Message};
use ringpost_tests::netns::Network;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Long enough for a connect across the bridge on a loaded machine, short enough that a cut
/// link fails within the test's patience.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const PORT: u16 = 7000;
/// How long a daemon inside a node may take to be ready (a debug build beside other tests).
const READY_WITHIN: Duration = Duration::from_secs(60);

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
        .args(["--listen", &listen, "--auth", "off", "--grpc-listen", "off", "--shards", "2", "--no-pin"])
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
