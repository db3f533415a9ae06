//! A topic of several publish sources through the CLI: each source placed on a forwarder shard
//! of its own, the count raised and never lowered, and every source kept across a restart.

use ringpost_tests::{failed, succeeded, Daemon};

/// Each source's leader shard in a topic's JSON, source 0 first.
fn leader_shards(json: &str) -> Vec<u32> {
    json.split("\"leader_shard\":")
        .skip(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap())
        .collect()
}

#[test]
fn a_topic_of_two_sources_has_one_on_each_shard_and_keeps_them_across_a_restart() {
    let mut daemon = Daemon::start("sources");
    let created = succeeded(&daemon.cli(&["topic", "create", "hot", "--sources", "2"]));
    let mut shards = leader_shards(&created);
    assert_eq!(shards.len(), 2, "{created}");
    shards.sort_unstable();
    assert_eq!(shards, [0, 1], "{created}");
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "hot"])), created);

    // Two shards hold one source of a topic each: a third has nowhere to go, and a source is
    // never retired yet.
    for count in ["3", "1"] {
        let refused = failed(&daemon.cli(&["topic", "update", "hot", "--sources", count]));
        assert!(refused.starts_with("FailedPrecondition"), "--sources {count}: {refused}");
    }
    let refused = failed(&daemon.cli(&["topic", "create", "wide", "--sources", "3"]));
    assert!(refused.starts_with("FailedPrecondition"), "{refused}");
    assert!(failed(&daemon.cli(&["topic", "get", "wide"])).starts_with("NotFound"));

    succeeded(&daemon.cli(&["topic", "create", "warm"]));
    assert_eq!(leader_shards(&succeeded(&daemon.cli(&["topic", "get", "warm"]))).len(), 1);
    let raised = succeeded(&daemon.cli(&["topic", "update", "warm", "--sources", "2"]));
    let mut shards = leader_shards(&raised);
    shards.sort_unstable();
    assert_eq!(shards, [0, 1], "{raised}");

    // Source 0 is the topic as it always was: publishing to it works as before.
    succeeded(&daemon.cli_with_input(&["publish", "hot"], Some("a message\n")));

    daemon.restart();
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "hot"])), created);
    assert_eq!(succeeded(&daemon.cli(&["topic", "get", "warm"])), raised);
}
