//! The router shard's start: on its own executor, it opens the catalog, connects to every
//! forwarder's control channels, recovers, then serves its port and runs its timers.

use super::os::{into_glommio, stop_on_close};
use super::{repeat_every, Config, ROUTER_IO_MEMORY_BYTES};
use crate::control::{ControlEnvelope, ControlReply};
use crate::{catalog, log, protocol, router, storage, sync};
use glommio::channels::shared_channel::{SharedReceiver, SharedSender};
use glommio::{LocalExecutorBuilder, Placement as CpuPlacement};
use std::net::TcpListener as StdListener;
use std::rc::Rc;
use std::sync::mpsc;

use protocol::grpc::bridge::{serve_jobs, JobReceiver};
use protocol::grpc::gateway::RouterShard;

/// What the router shard is given at start: its port, the router's ends of the forwarders'
/// control channels, the forwarders' ports and how to advertise them, its end of its stop
/// socket, and where it reports that it is ready and that it stopped.
pub(super) struct RouterWiring {
    pub listener: StdListener,
    pub to_forwarders: Vec<SharedSender<ControlEnvelope>>,
    pub from_forwarders: Vec<SharedReceiver<ControlReply>>,
    pub ports: Vec<u16>,
    pub advertise: router::Advertise,
    pub stop: std::os::unix::net::UnixStream,
    pub ready: mpsc::Sender<Result<(), String>>,
    pub stopped: mpsc::Sender<(String, usize)>,
    /// The gRPC API's jobs for the router, when it is served.
    pub grpc_jobs: Option<JobReceiver<RouterShard>>,
}

/// Starts the router shard for `shards` forwarder shards, which are serving already.
pub(super) fn start_router_shard(
    config: &Config,
    shards: usize,
    wiring: RouterWiring,
) -> Result<glommio::ExecutorJoinHandle<()>, String> {
    let data_dirs = config.data_dirs.clone();
    let balance_factor = config.balance_factor;
    let connection_limits = config.connections;
    let (access_settings, tls_settings) = (config.access.clone(), config.tls.clone());
    LocalExecutorBuilder::new(CpuPlacement::Unbound)
        .name("router")
        .io_memory(ROUTER_IO_MEMORY_BYTES)
        .spawn(move || async move {
            let RouterWiring {
                listener: router_listener,
                to_forwarders,
                from_forwarders,
                ports,
                advertise,
                stop: router_shard_stop,
                ready: router_ready,
                stopped: stopped_sender,
                grpc_jobs,
            } = wiring;
            let fail = |message: String| {
                let _ = router_ready.send(Err(message));
            };
            for data_dir in &data_dirs {
                if let Err(error) = storage::dma::warm_up_device_probe(data_dir, "router").await {
                    return fail(format!("probing {}: {error}", data_dir.display()));
                }
            }
            let directories = log::Directories::new(data_dirs);
            let storage = storage::dma::DmaStorage;
            let catalog = match catalog::Catalog::open(
                storage.clone(),
                directories.clone(),
                shards as u32,
                balance_factor,
            )
            .await
            {
                Ok(catalog) => catalog,
                Err(error) => return fail(error),
            };
            let mut links = Vec::new();
            for (sender, receiver) in to_forwarders.into_iter().zip(from_forwarders) {
                let link = router::ForwarderLink::new(sender.connect().await);
                crate::runtime::spawn(link.clone().receive_replies(receiver.connect().await)).detach();
                links.push(link);
            }
            let router = Rc::new(router::Router::new(
                storage,
                directories,
                catalog,
                links,
                router::ForwarderAddresses::new(ports, advertise),
                balance_factor,
            ));
            if let Err(error) = router.recover().await {
                return fail(error);
            }
            let security =
                match protocol::native::server::Security::open(&access_settings, tls_settings.as_ref()) {
                    Ok(security) => security,
                    Err(error) => return fail(error),
                };
            let listener = into_glommio(router_listener);
            let _ = router_ready.send(Ok(()));
            run_router_timers(&router);
            let stop = sync::Stop::default();
            stop_on_close(router_shard_stop, stop.clone());
            if let Some(jobs) = grpc_jobs {
                let target = Rc::new(RouterShard { router: router.clone(), access: security.access.clone() });
                crate::runtime::spawn(serve_jobs(jobs, target, stop.clone())).detach();
            }
            let connections =
                protocol::native::server::serve(listener, router, stop, connection_limits, security).await;
            let _ = stopped_sender.send(("router".to_owned(), connections));
        })
        .map_err(|e| format!("starting the router shard: {e}"))
}

/// The router shard's timer: subscription expiry, the catalog's disk reserve, and the
/// catalog's compaction.
fn run_router_timers<S: storage::Storage>(router: &Rc<router::Router<S>>) {
    let expirer = router.clone();
    repeat_every(router::EXPIRATION_CHECK_INTERVAL, async move || {
        expirer.expire_subscriptions().await;
        expirer.retake_catalog_reserve().await;
        match expirer.compact_catalog().await {
            Ok(false) => {}
            Ok(true) => eprintln!("ringpostd: compacted the catalog: snapshot taken, raft log purged"),
            Err(error) => eprintln!("ringpostd: compacting the catalog: {error}"),
        }
    });
}
