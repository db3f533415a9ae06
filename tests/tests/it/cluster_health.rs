//! A cluster that says when it is broken, on real nodes on loopback: a catalog leader cut off
//! from its majority stops claiming the lead (`/readyz`, `ringpost_catalog_leader_node`, the
//! shipped alert's expression, `cluster status`, one log line); `cluster status` shows a killed
//! node unreachable and never a dead node as leader; a node waiting with `--join` is idle,
//! answers `/healthz` and refuses at once; a removed node refuses; a node stuck in its start
//! stops at SIGTERM.

use ringpost_client::{block_on, ErrorCode, Message};
use ringpost_tests::cluster::Cluster;
use ringpost_tests::scrape::{http_get, Scrape};
use ringpost_tests::{failed, succeeded, Daemon};
use std::time::{Duration, Instant};

/// Generous bounds that tell a daemon that noticed from one that never does, on a loaded
/// machine: the daemon's own bounds are 1.5 s (a member unreachable) and 2 s (a majority or a
/// leader silent), checked four times a second.
const NOTICED_WITHIN: Duration = Duration::from_secs(15);

fn http_args() -> Vec<String> {
    vec!["--http-listen".to_owned(), "127.0.0.1:0".to_owned()]
}

/// Polls `check` until it gives a value, at most `limit`; panics naming `what`.
fn eventually<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of `name`'s sample without labels in a scrape of `http`.
fn gauge(http: &str, name: &str) -> f64 {
    let (status, body) = http_get(http, "/metrics");
    assert_eq!(status, 200, "{body}");
    let scrape = Scrape::parse(&body);
    scrape
        .samples
        .iter()
        .find(|sample| sample.name == name && sample.labels.is_empty())
        .unwrap_or_else(|| panic!("no {name} in the scrape"))
        .value
}

/// Whether the shipped alert `RingpostCatalogWithoutLeader` fires, by promtool's evaluation of
/// docs/monitoring/alerts.yml over a minute of a node's `ringpost_catalog_leader_node` held
/// at `leader_node`, the value a scrape read.
fn catalog_alert_fires(leader_node: f64) -> bool {
    let promtool = crate::monitoring::promtool();
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring/alerts.yml");
    let text = std::fs::read_to_string(&rules).unwrap();
    let rule = &text[text.find("alert: RingpostCatalogWithoutLeader").expect("the alert is shipped")..];
    // Its annotations as promtool renders them for a series of instance "node".
    let annotation = |name: &str| {
        let text = rule
            .lines()
            .take_while(|line| {
                !line.trim_start().starts_with("- alert:") || line.contains("CatalogWithoutLeader")
            })
            .find_map(|line| line.trim().strip_prefix(&format!("{name}: ")).map(str::to_owned))?;
        Some(text.trim_matches('"').replace("{{ $labels.instance }}", "node"))
    };
    let mut annotations = String::new();
    for name in ["summary", "description"] {
        if let Some(text) = annotation(name) {
            annotations.push_str(&format!("              {name}: {text:?}\n"));
        }
    }
    let directory = ringpost_tests::temporary_directory("catalog-alert");
    let test = directory.join("catalog-alert-test.yml");
    let firing = format!(
        "rule_files:\n  - {}\nevaluation_interval: 15s\ntests:\n  - interval: 15s\n    input_series:\n      \
         - series: 'ringpost_catalog_leader_node{{instance=\"node\"}}'\n        values: '{leader_node}x8'\n    \
         alert_rule_test:\n      - eval_time: 2m\n        alertname: RingpostCatalogWithoutLeader\n        \
         exp_alerts:\n          - exp_labels:\n              severity: page\n              instance: node\n            \
         exp_annotations:\n{annotations}",
        rules.display()
    );
    std::fs::write(&test, firing).unwrap();
    let output = std::process::Command::new(&promtool).arg("test").arg("rules").arg(&test).output().unwrap();
    let _ = std::fs::remove_dir_all(&directory);
    output.status.success()
}

/// The process's CPU time so far (user and system), from /proc.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let getconf = std::process::Command::new("getconf").arg("CLK_TCK").output().unwrap();
    let per_second: u64 = String::from_utf8_lossy(&getconf.stdout).trim().parse().unwrap();
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Lines of `log` that contain `text`.
fn count(log: &str, text: &str) -> usize {
    log.lines().filter(|line| line.contains(text)).count()
}

#[test]
fn a_leader_cut_off_from_its_majority_stops_claiming_the_lead() {
    let mut cluster = Cluster::start("health-quorum", 3, http_args());
    let leader = cluster.leader();
    let http = cluster.node(leader).http_address.clone().unwrap();
    assert_eq!(http_get(&http, "/readyz"), (200, "ready\n".to_owned()));
    let healthy = gauge(&http, "ringpost_catalog_leader_node");
    assert_eq!(healthy, leader as f64);
    assert!(!catalog_alert_fires(healthy), "the alert fired for a cluster with a leader");

    let followers: Vec<u64> = cluster.ids().filter(|id| *id != leader).collect();
    for id in &followers {
        cluster.node_mut(*id).kill();
    }
    let killed = Instant::now();
    let reason = eventually(NOTICED_WITHIN, "the lone leader's /readyz says 503", || {
        let (status, body) = http_get(&http, "/readyz");
        (status == 503).then_some(body)
    });
    eprintln!("the lone leader not ready {:?} after the kills: {}", killed.elapsed(), reason.trim());
    assert!(reason.contains("has not heard from a majority of its voters"), "{reason}");
    assert_eq!(gauge(&http, "ringpost_catalog_leader_node"), 0.0);
    assert!(catalog_alert_fires(0.0), "the alert does not fire on the lone leader's scrape");

    let status = block_on(cluster.node(leader).client().cluster_status()).unwrap();
    assert_eq!(status.catalog_leader, None, "{status:?}");
    assert!(status.not_serving.as_deref().is_some_and(|why| why.contains("majority")), "{status:?}");
    for node in &status.nodes {
        let expected = if node.node_id == leader { "leader-without-quorum" } else { "unreachable" };
        assert_eq!(node.role, expected, "{status:?}");
    }
    // Said once in the log, not at each look.
    std::thread::sleep(Duration::from_secs(2));
    let log = cluster.node(leader).log();
    assert_eq!(count(&log, "lost contact with a majority of the catalog's voters"), 1, "{log}");
    for id in &followers {
        assert_eq!(count(&log, &format!("node {id} does not answer the catalog's leader")), 1, "{log}");
    }

    for id in &followers {
        cluster.node_mut(*id).restart();
    }
    let leader = cluster.leader();
    let http = cluster.node(leader).http_address.clone().unwrap();
    eventually(NOTICED_WITHIN, "the leader ready again", || {
        (http_get(&http, "/readyz").0 == 200).then_some(())
    });
}

#[test]
fn cluster_status_shows_a_killed_node_unreachable_and_never_a_dead_leader() {
    let mut cluster = Cluster::start("health-liveness", 3, Vec::new());
    let leader = cluster.leader();
    let follower = cluster.ids().find(|id| *id != leader).unwrap();
    let survivor = cluster.ids().find(|id| *id != leader && *id != follower).unwrap();
    let status = cluster.status(survivor).unwrap();
    for node in &status.nodes {
        assert!(node.heard_ms_ago.is_some_and(|ago| ago < 1500), "a live member: {status:?}");
    }

    cluster.node_mut(follower).kill();
    let killed = Instant::now();
    let seen = eventually(NOTICED_WITHIN, "the killed follower shown unreachable", || {
        let status = cluster.status(survivor).ok()?;
        let node = status.nodes.iter().find(|node| node.node_id == follower)?;
        (node.role == "unreachable").then_some(node.heard_ms_ago)
    });
    eprintln!(
        "node {follower} shown unreachable {:?} after its kill, last heard {seen:?} ms ago",
        killed.elapsed()
    );
    assert!(seen.is_some_and(|ago| ago >= 1500));
    let output = cluster.node(survivor).cli(&["cluster", "status", "--output", "table"]);
    let table = succeeded(&output);
    assert!(table.contains("LAST_HEARD_S"), "{table}");
    assert!(table
        .lines()
        .any(|line| line.starts_with(&follower.to_string()) && line.contains("unreachable")));
    cluster.node_mut(follower).restart();
    eventually(NOTICED_WITHIN, "the restarted follower heard again", || {
        let status = cluster.status(survivor).ok()?;
        status.nodes.iter().find(|node| node.node_id == follower && node.role == "follower").map(|_| ())
    });

    // The leader goes: past the bound within which a follower cannot know, no survivor names it.
    cluster.node_mut(leader).kill();
    let killed = Instant::now();
    let mut named_after = None;
    while killed.elapsed() < Duration::from_secs(8) {
        for id in [follower, survivor] {
            let Ok(status) = cluster.status(id) else { continue };
            let shown = status.catalog_leader == Some(leader)
                || status.nodes.iter().any(|node| node.node_id == leader && node.role == "leader");
            if shown {
                named_after = Some(killed.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let last = named_after.unwrap_or_default();
    eprintln!("the dead leader was last named {last:?} after its kill");
    // A follower names its leader while it heard it within 2 s; the answer may take a moment.
    assert!(last < Duration::from_secs(4), "the dead leader named {last:?} after its kill");
    let new_leader = cluster.leader();
    assert_ne!(new_leader, leader);
    for id in [follower, survivor] {
        let log = cluster.node(id).log();
        assert_eq!(count(&log, &format!("the catalog's leader is node {new_leader}")), 1, "node {id}: {log}");
    }
    let log = cluster.node(new_leader).log();
    assert_eq!(count(&log, &format!("node {leader} does not answer the catalog's leader")), 1, "{log}");
}

#[test]
fn a_joining_node_is_idle_and_refuses_and_a_removed_one_refuses() {
    let mut cluster = Cluster::start("health-members", 3, http_args());
    let joining = cluster.launch_joining();
    let http = cluster.node(joining).http_address.clone().unwrap();
    // Its endpoints answer while it waits: health yes, readiness no, with the reason.
    let reason = eventually(NOTICED_WITHIN, "the joining node's /readyz says it waits to be added", || {
        std::net::TcpStream::connect(&http).ok()?;
        let (status, body) = http_get(&http, "/readyz");
        assert_eq!(status, 503, "{body}");
        body.contains("not yet a member").then_some(body)
    });
    eprintln!("the joining node: {}", reason.trim());
    assert_eq!(http_get(&http, "/healthz"), (200, "ok\n".to_owned()));
    // Idle: a few seconds of waiting take well under a tenth of a core.
    let pid = cluster.node(joining).pid().unwrap();
    let (cpu, started) = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let share = (cpu_time(pid) - cpu).as_secs_f64() / started.elapsed().as_secs_f64();
    eprintln!("the joining node used {:.1}% of a core while it waited", share * 100.0);
    assert!(share < 0.10, "{:.1}% of a core", share * 100.0);
    // A client is refused at once, told why.
    let started = Instant::now();
    let refused = failed(&cluster.node(joining).cli(&["topic", "create", "through-a-joiner"]));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(refused.starts_with("Unavailable") && refused.contains("not yet a member"), "{refused}");

    let address = cluster.cluster_addresses[(joining - 1) as usize].clone();
    succeeded(&cluster.node(1).cli(&["cluster", "add-node", &joining.to_string(), &address]));
    cluster.wait_ready(joining);
    assert_eq!(http_get(&http, "/readyz").0, 200);
    succeeded(&cluster.node(1).cli(&["topic", "create", "before-the-removal"]));

    succeeded(&cluster.node(1).cli(&["cluster", "remove-node", &joining.to_string()]));
    // First it no longer hears its leader (2 s), then a member tells it was removed.
    let reason = eventually(NOTICED_WITHIN, "the removed node's /readyz says it was removed", || {
        let (status, body) = http_get(&http, "/readyz");
        (status == 503 && body.contains("was removed from the cluster")).then_some(body)
    });
    eprintln!("the removed node: {}", reason.trim());
    let refused = failed(&cluster.node(joining).cli(&["topic", "create", "through-a-removed-node"]));
    assert!(refused.starts_with("FailedPrecondition") && refused.contains("was removed"), "{refused}");
    let client = cluster.node(joining).client();
    let error = block_on(client.publish("before-the-removal", vec![Message::new("x")])).unwrap_err();
    assert_eq!(error.code(), ErrorCode::FailedPrecondition, "{error}");
    eventually(NOTICED_WITHIN, "the removed node logs its removal", || {
        (count(&cluster.node(joining).log(), "was removed from the cluster") == 1).then_some(())
    });
    assert!(failed(&cluster.node(1).cli(&["topic", "get", "through-a-removed-node"])).starts_with("NotFound"));
    for id in 1..=3 {
        assert_eq!(
            count(&cluster.node(id).log(), &format!("node {joining} left the cluster")),
            1,
            "node {id}"
        );
    }

    // The next node joins with the members' addresses and its own alone: no placeholder for
    // the node removed.
    cluster.node_mut(joining).kill();
    let next = cluster.launch_joining_without(&[joining]);
    let address = cluster.cluster_addresses[(next - 1) as usize].clone();
    succeeded(&cluster.node(1).cli(&["cluster", "add-node", &next.to_string(), &address, "--voter"]));
    cluster.wait_ready(next);
    succeeded(&cluster.node(next).cli(&["topic", "create", "through-the-next-node"]));
}

#[test]
fn sigterm_stops_a_node_that_waits_in_its_start() {
    // One node of three started alone waits for a majority that never comes. Its cluster
    // port is one found free and let go, which a test beside it may take meanwhile: then it
    // starts again on other ports, as the cluster harness does.
    let mut attempts = 0;
    let mut daemon = loop {
        attempts += 1;
        let ports: Vec<u16> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
            .collect();
        let list: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let args = ["--node-id", "1", "--cluster", &list.join(","), "--shards", "1", "--no-pin"];
        let mut daemon = Daemon::prepare("health-stuck-start", Vec::new(), args.map(String::from).to_vec());
        daemon.launch();
        std::thread::sleep(Duration::from_secs(3));
        let ready = daemon.poll_ready();
        if ready.is_err() && attempts < 3 && daemon.log().contains("Address already in use") {
            continue;
        }
        assert_eq!(ready, Ok(false), "a node alone of three served");
        break daemon;
    };
    let pid = daemon.pid().unwrap();
    let (cpu, started) = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let share = (cpu_time(pid) - cpu).as_secs_f64() / started.elapsed().as_secs_f64();
    assert!(share < 0.10, "the waiting start took {:.1}% of a core", share * 100.0);
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_for_exit(Duration::from_secs(10)).expect("SIGTERM did not stop a waiting start");
    assert!(status.success(), "{status}");
    assert!(daemon.log().contains("SIGTERM while starting"), "{}", daemon.log());
}

/// `remove-node` on a node holding replicas of empty topics moves them within seconds (it once
/// waited 60 s for a new replica to "catch up" with nothing), and a topic of one replica on
/// the node is named at once, before anything moves; `cluster status` shows where it lives.
#[test]
fn remove_node_moves_empty_replicas_at_once_and_names_a_one_replica_topic() {
    let mut cluster = Cluster::start("health-removal", 3, Vec::new());
    let joining = cluster.launch_joining();
    let address = cluster.cluster_addresses[(joining - 1) as usize].clone();
    succeeded(&cluster.node(1).cli(&["cluster", "add-node", &joining.to_string(), &address, "--voter"]));
    cluster.wait_ready(joining);
    let topics: Vec<String> = (0..12).map(|index| format!("empty-{index:02}")).collect();
    for topic in &topics {
        succeeded(&cluster.node(1).cli(&["topic", "create", topic, "--replicas", "3"]));
    }
    // A topic of one replica on the node to remove: created until placement puts one there.
    let status = |id: u64| block_on(cluster.node(id).client().cluster_status()).unwrap();
    let single = (0..40)
        .map(|index| format!("single-{index:02}"))
        .find(|name| {
            succeeded(&cluster.node(1).cli(&["topic", "create", name, "--replicas", "1"]));
            let placed = status(1).topics.into_iter().find(|topic| &topic.name == name).unwrap();
            assert_eq!(placed.replica_nodes.len(), 1, "{placed:?}");
            placed.replica_nodes == [joining]
        })
        .expect("no one-replica topic placed on the joined node in 40");
    let on_joined = status(1).topics.iter().filter(|topic| topic.replica_nodes.contains(&joining)).count();
    eprintln!("node {joining} holds replicas of {on_joined} topics, '{single}' alone");

    let started = Instant::now();
    let refused = failed(&cluster.node(1).cli(&["cluster", "remove-node", &joining.to_string()]));
    eprintln!("remove-node refused after {:?}: {}", started.elapsed(), refused.trim());
    assert!(refused.starts_with("FailedPrecondition") && refused.contains(&single), "{refused}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // Refused before anything moved.
    let still = status(1).topics.iter().filter(|topic| topic.replica_nodes.contains(&joining)).count();
    assert_eq!(still, on_joined);

    succeeded(&cluster.node(1).cli(&["topic", "delete", &single]));
    let started = Instant::now();
    succeeded(&cluster.node(1).cli(&["cluster", "remove-node", &joining.to_string()]));
    eprintln!("remove-node moved {} replicas in {:?}", on_joined - 1, started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    let placed = status(1);
    for topic in placed.topics.iter().filter(|topic| topics.contains(&topic.name)) {
        assert_eq!(topic.replica_nodes.len(), 3, "{topic:?}");
        assert!(!topic.replica_nodes.contains(&joining), "{topic:?}");
    }
}

/// `ringpost stats` through any node shows every node's topics and subscriptions, each JSON
/// line naming its kind and node; a node that does not answer is marked within a bound and the
/// rest is shown; the replicas' metrics name followers by node and forwarder.
#[test]
fn stats_through_any_node_show_the_whole_cluster() {
    let mut cluster = Cluster::start("health-stats", 3, http_args());
    succeeded(&cluster.node(1).cli(&["topic", "create", "everywhere", "--replicas", "3"]));
    for id in cluster.ids() {
        let name = format!("through-{id}");
        succeeded(&cluster.node(id).cli(&["sub", "create", &name, "--topic", "everywhere"]));
    }
    succeeded(&cluster.node(2).cli(&["publish", "everywhere", "a", "b"]));
    let leader = cluster.topic_leader("everywhere");
    for id in cluster.ids() {
        let json = succeeded(&cluster.node(id).cli(&["stats"]));
        for line in json.lines() {
            assert!(line.contains("\"kind\":\"") && line.contains(",\"node\":"), "node {id}: {line}");
        }
        let subscriptions: Vec<&str> =
            json.lines().filter(|line| line.contains("\"kind\":\"subscription\"")).collect();
        assert_eq!(subscriptions.len(), 3, "through node {id}: {json}");
        assert!(subscriptions.iter().all(|line| line.contains(&format!("\"node\":{leader}}}"))), "{json}");
        assert!(subscriptions.iter().all(|line| line.contains("\"idle_ms\":")), "{json}");
        let processes = json.lines().filter(|line| line.contains("\"kind\":\"process\"")).count();
        assert_eq!(processes, 3, "through node {id}: {json}");
        let replicas = json.lines().filter(|line| line.contains("\"follower_node\":")).count();
        assert_eq!(replicas, 2, "the leader's two followers, through node {id}: {json}");
        assert!(!json.contains("follower_shard"), "{json}");
    }
    let table = succeeded(&cluster.node(1).cli(&["--output", "table", "stats"]));
    let header = table.lines().next().unwrap();
    assert!(header.starts_with("NODE") && header.contains("IDLE_S"), "{table}");
    // Every cell under a figure's heading is a number or a dash.
    let columns: Vec<&str> = header.split_whitespace().collect();
    let published = columns.iter().position(|column| *column == "PUBLISHED_PER_S").unwrap();
    for row in table.lines().skip(1).take_while(|line| !line.starts_with("NODE")) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        let cell = cells[published];
        assert!(cell == "-" || cell.parse::<u64>().is_ok(), "{row}");
    }
    let http = cluster.node(leader).http_address.clone().unwrap();
    let (_, metrics) = http_get(&http, "/metrics");
    assert!(
        metrics.contains("ringpost_replica_follower_lag_messages{topic=\"everywhere\",follower_node=\""),
        "{metrics}"
    );
    assert!(!metrics.contains("follower_shard"));

    let down = cluster.ids().find(|id| *id != leader).unwrap();
    let asking = cluster.ids().find(|id| *id != down).unwrap();
    cluster.node_mut(down).kill();
    let started = Instant::now();
    let json = succeeded(&cluster.node(asking).cli(&["stats"]));
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    let marked = json.lines().find(|line| line.contains("\"kind\":\"node\"")).expect(&json);
    assert!(
        marked.contains(&format!("\"node\":{down}")) && marked.contains("\"answered\":false"),
        "{marked}"
    );
    assert_eq!(json.lines().filter(|line| line.contains("\"kind\":\"subscription\"")).count(), 3, "{json}");
}
