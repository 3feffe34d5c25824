//! What one tenant may keep on the host's disk: versions, the bytes of its components and of their compiled
//! forms ([`Quota`], from `[quota]` and `[tenants.quota]`), and what it keeps now ([`Usage`]). An upload that
//! would take the tenant over any of them is refused (`409 over_quota`) before it is stored; deleting
//! versions makes room.
//!
//! A tenant is charged for each component its versions hold once (two versions of the same bytes are one
//! component), whether or not another tenant holds the same bytes: what one tenant is charged says nothing
//! of the others.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a tenant may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Quota {
    /// Versions, across all the tenant's agents.
    pub versions: u64,
    /// Bytes of the components its versions hold, each component once.
    pub stored_bytes: u64,
    /// Bytes of their compiled forms in the host's cache.
    pub compiled_bytes: u64,
}

impl Quota {
    /// When the config sets none: 100 versions, 1 GiB of components, 4 GiB compiled (a Python agent is
    /// 18 MB and compiles to about 40 MB).
    pub const DEFAULT: Quota = Quota {
        versions: 100,
        stored_bytes: 1 << 30,
        compiled_bytes: 4 << 30,
    };

    /// Why `usage` is over this quota, if it is: the first key it passes, with what to do.
    pub fn refusal(&self, usage: &Usage) -> Option<String> {
        let over = |what: &str, key: &str, used: u64, most: u64, unit: u64| {
            let (used, most) = (used.div_ceil(unit), most / unit);
            let unit = if unit == 1 { "" } else { " MiB" };
            format!(
                "the tenant would keep {used}{unit} of {what}, over its quota ({key} = {most}): delete \
                 versions it no longer needs, or ask the operator for more"
            )
        };
        if usage.versions > self.versions {
            return Some(over(
                "versions",
                "quota.versions",
                usage.versions,
                self.versions,
                1,
            ));
        }
        if usage.stored_bytes > self.stored_bytes {
            let (used, most) = (usage.stored_bytes, self.stored_bytes);
            return Some(over("components", "quota.stored_mib", used, most, 1 << 20));
        }
        if usage.compiled_bytes > self.compiled_bytes {
            let (used, most) = (usage.compiled_bytes, self.compiled_bytes);
            return Some(over(
                "compiled code",
                "quota.compiled_mib",
                used,
                most,
                1 << 20,
            ));
        }
        None
    }
}

/// What a tenant keeps now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    /// Versions, across all its agents.
    pub versions: u64,
    /// Bytes of the components its versions hold, each component once.
    pub stored_bytes: u64,
    /// Bytes of their compiled forms in the host's cache.
    pub compiled_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUOTA: Quota = Quota {
        versions: 3,
        stored_bytes: 10 << 20,
        compiled_bytes: 20 << 20,
    };

    fn usage(versions: u64, stored_mib: u64, compiled_mib: u64) -> Usage {
        Usage {
            versions,
            stored_bytes: stored_mib << 20,
            compiled_bytes: compiled_mib << 20,
        }
    }

    #[test]
    fn usage_up_to_the_quota_is_allowed() {
        assert_eq!(QUOTA.refusal(&usage(3, 10, 20)), None);
        assert_eq!(QUOTA.refusal(&Usage::default()), None);
    }

    #[test]
    fn usage_over_any_part_is_refused_naming_the_key_to_raise() {
        let message = QUOTA.refusal(&usage(4, 1, 1)).unwrap();
        assert!(
            message.contains("4 of versions, over its quota (quota.versions = 3)"),
            "{message}"
        );
        let over_stored = Usage {
            stored_bytes: (10 << 20) + 1,
            ..usage(1, 0, 1)
        };
        let message = QUOTA.refusal(&over_stored).unwrap();
        assert!(
            message.contains("11 MiB of components, over its quota (quota.stored_mib = 10)"),
            "{message}"
        );
        let message = QUOTA.refusal(&usage(1, 1, 21)).unwrap();
        assert!(message.contains("quota.compiled_mib = 20"), "{message}");
        assert!(message.contains("delete versions"), "{message}");
    }
}
