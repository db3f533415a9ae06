//! What guards a shard's connections (`Security`: access, TLS, the cluster's hosts) and the
//! check each second that reloads them and closes the connections whose session ended.

use super::*;

/// Hosts a shard counts as the cluster's nodes': the hosts of the largest cluster
/// (`CLUSTER_NODES_MAX`, 256) a few times over. Beyond them, connections count as strangers'.
pub const CLUSTER_HOSTS_MAX: usize = 1024;
// Every host `--cluster` may name fits (`cluster_hosts` takes those first).
const _: () = assert!(crate::node::CLUSTER_NODES_MAX <= CLUSTER_HOSTS_MAX);

/// The hosts of the cluster's nodes, as one shard knows them now: those `--cluster` names and
/// those of the nodes the catalog registered since (an `add-node`, a `--join`). Their
/// connections before authentication have a budget of their own
/// (`CLUSTER_CONNECTIONS_UNAUTHENTICATED_MAX`). Shared by the servers of one shard (`Rc`, no
/// lock); each shard has its own, which the router shard keeps current by message
/// (`ControlRequest::ClusterHosts`), as its catalog's registrations change.
#[derive(Clone, Default)]
pub struct ClusterHosts(Rc<RefCell<HashSet<IpAddr>>>);

impl ClusterHosts {
    pub fn new(hosts: impl IntoIterator<Item = IpAddr>) -> ClusterHosts {
        let known = ClusterHosts::default();
        known.replace(hosts);
        known
    }

    pub fn contains(&self, host: IpAddr) -> bool {
        self.0.borrow().contains(&host)
    }

    /// From now on the hosts are `hosts`: connections open keep the budget they were counted in.
    /// Returns whether that changed anything.
    pub fn replace(&self, hosts: impl IntoIterator<Item = IpAddr>) -> bool {
        let hosts: HashSet<IpAddr> = hosts.into_iter().collect();
        assert!(hosts.len() <= CLUSTER_HOSTS_MAX, "{} hosts of the cluster's nodes", hosts.len());
        let changed = *self.0.borrow() != hosts;
        *self.0.borrow_mut() = hosts;
        changed
    }
}

/// What guards one shard's connections: who may do what, TLS when it is on, and the hosts of
/// the cluster's nodes. Each shard builds its own (`Security::open`), from the same files.
pub struct Security {
    pub access: Rc<Access>,
    pub tls: Option<Tls>,
    pub cluster_hosts: ClusterHosts,
}

impl Security {
    /// Everyone may do everything, in plaintext.
    pub fn off() -> Security {
        Security { access: Rc::new(Access::off()), tls: None, cluster_hosts: ClusterHosts::default() }
    }

    /// The same security, knowing the hosts of the cluster's nodes (and whatever they become).
    pub fn with_cluster_hosts(self, hosts: ClusterHosts) -> Security {
        Security { cluster_hosts: hosts, ..self }
    }

    /// Reads the access file and the TLS files; an error names the file and what is wrong.
    pub fn open(access: &AccessSettings, tls: Option<&TlsSettings>) -> Result<Security, String> {
        Security::open_with_cluster(access, tls, None)
    }

    /// `open`, for a forwarder's port in a cluster: other nodes' forwarders that present the
    /// cluster's secret replicate sources here (`Access::with_cluster_secret`).
    pub fn open_with_cluster(
        access: &AccessSettings,
        tls: Option<&TlsSettings>,
        cluster_secret: Option<&str>,
    ) -> Result<Security, String> {
        let access = Rc::new(Access::open(access)?.with_cluster_secret(cluster_secret));
        let tls = tls.map(Tls::open).transpose()?;
        Ok(Security { access, tls, cluster_hosts: ClusterHosts::default() })
    }
}

impl Shard {
    /// Reloads the access file and the certificates if they changed, then closes (through
    /// their reading side, as a stop does) the connections whose session no longer holds.
    fn check_security(&self) {
        if let Some(Err(error)) = self.access.reload_if_changed() {
            crate::log_warn!(
                "ringpostd: the access file was not reloaded, the one before stays in force: {error}"
            );
        }
        match self.tls.as_ref().and_then(Tls::reload_if_changed) {
            Some(Ok(())) => crate::log_info!("ringpostd: reloaded the TLS certificates for new connections"),
            Some(Err(error)) => {
                crate::log_warn!("ringpostd: the TLS certificates were not reloaded, the ones before stay in force: {error}")
            }
            None => {}
        }
        let now = std::time::UNIX_EPOCH + Duration::from_millis(crate::runtime::wall_ms());
        for (socket, link) in self.links.borrow().iter() {
            if link.ending.borrow().is_some() {
                continue;
            }
            if let Err(status) = self.access.still_valid(&link.session.borrow(), now) {
                let status = Status::from(status);
                let message =
                    format!("the connection's credential no longer holds, it closes: {}", status.message);
                *link.ending.borrow_mut() = Some(Status::new(status.code, message));
                let _ = nix::sys::socket::shutdown(*socket, nix::sys::socket::Shutdown::Read);
            }
        }
    }
}

/// Runs the shard's security check each `SECURITY_CHECK_INTERVAL` until the stop.
pub(super) async fn check_security_each_interval(shard: Rc<Shard>, stop: Stop) {
    loop {
        if stop.sleep(SECURITY_CHECK_INTERVAL).await {
            return;
        }
        shard.check_security();
    }
}
