//! What the cluster helper reads of `CLUSTER NODES`, and the key hashing of Redis Cluster.
/// One line of `CLUSTER NODES`, as one node sees another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodeView {
    pub(super) id: String,
    pub(super) port: u16,
    pub(super) flags: Vec<String>,
    /// The master's id, for a replica.
    pub(super) master: Option<String>,
    /// Slot ranges served, inclusive.
    pub(super) slots: Vec<(u16, u16)>,
}

impl NodeView {
    pub(super) fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Whether the cluster counts it: not failed, not suspected, not half met.
    pub(super) fn counted(&self) -> bool {
        !["fail", "fail?", "handshake", "noaddr"]
            .iter()
            .any(|f| self.has(f))
    }
}

/// The counted master serving `slot`.
pub(super) fn owner_of(views: &[NodeView], slot: u16) -> Option<u16> {
    views
        .iter()
        .filter(|v| v.has("master") && v.counted())
        .find(|v| v.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        .map(|v| v.port)
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@bus[,host]> <flags> <master|-> <ping> <pong>
/// <epoch> <link> <slot ranges…>`, where a slot being moved shows as `[slot->-id]`.
pub(super) fn parse_node_line(line: &str) -> Result<NodeView, String> {
    let bad = || format!("a CLUSTER NODES line not understood: {line}");
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [id, addr, flags, master, _, _, _, _, slots @ ..] = fields.as_slice() else {
        return Err(bad());
    };
    let port = addr
        .split(['@', ','])
        .next()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(bad)?;
    let range = |s: &str| -> Option<(u16, u16)> {
        match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|a| (a, a)),
        }
    };
    let slots = slots
        .iter()
        .filter(|s| !s.starts_with('['))
        .map(|s| range(s).ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    Ok(NodeView {
        id: (*id).to_owned(),
        port,
        flags: flags.split(',').map(str::to_owned).collect(),
        master: (*master != "-").then(|| (*master).to_owned()),
        slots,
    })
}

/// CRC16 with the XMODEM parameters (polynomial 0x1021, initial value 0), as Redis Cluster
/// hashes keys.
pub(super) fn crc16_xmodem(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_cluster::{RedisCluster, SLOTS};

    #[test]
    fn crc16_matches_the_check_value_of_xmodem() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    }

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        let slot = RedisCluster::slot_of;
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b""), 0);
    }

    #[test]
    fn node_lines_parse_with_slots_in_migration() {
        let line = "07c3 127.0.0.1:30004@40004,host slave e7d1 0 1 2 connected";
        let v = parse_node_line(line).unwrap();
        assert_eq!((v.port, v.master.as_deref()), (30004, Some("e7d1")));
        let line = "e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5 9 [7->-07c3]";
        let v = parse_node_line(line).unwrap();
        assert_eq!(v.slots, vec![(0, 5), (9, 9)]);
        assert!(v.has("master") && v.has("myself") && v.master.is_none());
        assert!(parse_node_line("garbage").is_err());
    }
}
