//! Hadoop client configuration: `core-site.xml` and `hdfs-site.xml` from
//! `$HADOOP_CONF_DIR`, with Hadoop's layering (`final` properties are not
//! overridden by later files), deprecated-name mapping for the keys we read,
//! and `${...}` expansion as Hadoop's `Configuration.substituteVars` does it:
//! the left-most innermost `${var}` is replaced, first from the environment
//! (`${env.NAME}`, `${env.NAME:-default}`, `${env.NAME-default}`), else from a
//! small set of emulated Java system properties (`user.name`, `user.home`,
//! `user.dir`, `java.io.tmpdir`), else from the configuration; an unbound
//! variable stops expansion and is left as written; a self-reference returns
//! the raw value; more than 20 substitutions is an error.
//!
//! It also resolves a URI authority to the namenode HTTP addresses that serve
//! WebHDFS ([`HadoopConf::namenode_http_addresses`]), following HA nameservices.
//! XInclude is not supported.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use crate::error::{HdfsError, Result};
use crate::location::Scheme;

/// Default namenode HTTP port in Hadoop 3.
pub const DEFAULT_NAMENODE_HTTP_PORT: u16 = 9870;

/// Hadoop's limit on `${...}` substitutions in one value.
const MAX_SUBST: usize = 20;

/// Deprecated key → current key, for the keys this crate reads.
const DEPRECATED: &[(&str, &str)] = &[
    ("fs.default.name", "fs.defaultFS"),
    ("dfs.http.address", "dfs.namenode.http-address"),
];

#[derive(Debug, Deserialize)]
struct XmlConfiguration {
    #[serde(rename = "property", default)]
    properties: Vec<XmlProperty>,
}

#[derive(Debug, Deserialize)]
struct XmlProperty {
    name: Option<String>,
    value: Option<String>,
    #[serde(rename = "final")]
    is_final: Option<String>,
}

/// A loaded Hadoop configuration.
#[derive(Debug, Clone, Default)]
pub struct HadoopConf {
    props: HashMap<String, String>,
    finals: HashSet<String>,
    /// Where each key was last set (file path or "programmatically").
    sources: HashMap<String, String>,
    /// Overrides for emulated Java system properties and environment
    /// variables (tests and embedding); looked up before the real ones.
    system_overrides: HashMap<String, String>,
    env_overrides: HashMap<String, String>,
}

impl HadoopConf {
    /// An empty configuration (everything at its default).
    pub fn new() -> Self {
        HadoopConf::default()
    }

    /// Reads `core-site.xml` then `hdfs-site.xml` from `dir`; missing files are
    /// skipped, a missing directory or a malformed file is an error.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(HdfsError::Config {
                source_name: dir.display().to_string(),
                reason: "not a directory (HADOOP_CONF_DIR must name the folder holding core-site.xml and hdfs-site.xml)".into(),
            });
        }
        let mut conf = HadoopConf::new();
        for name in ["core-site.xml", "hdfs-site.xml"] {
            let path = dir.join(name);
            if path.is_file() {
                conf.load_file(&path)?;
            }
        }
        Ok(conf)
    }

    /// [`HadoopConf::from_dir`] on `$HADOOP_CONF_DIR` when it is set and not
    /// empty; otherwise an empty configuration.
    pub fn from_env() -> Result<Self> {
        match std::env::var_os("HADOOP_CONF_DIR") {
            Some(dir) if !dir.is_empty() => HadoopConf::from_dir(dir).map_err(|e| match e {
                HdfsError::Config {
                    source_name,
                    reason,
                } => HdfsError::Config {
                    source_name: format!("$HADOOP_CONF_DIR={source_name}"),
                    reason,
                },
                other => other,
            }),
            _ => Ok(HadoopConf::new()),
        }
    }

    /// Loads one `*-site.xml` file on top of what is loaded.
    pub fn load_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|e| HdfsError::Config {
            source_name: path.display().to_string(),
            reason: format!("cannot read: {e}"),
        })?;
        self.load_str(&text, &path.display().to_string())
    }

    /// Loads configuration XML from a string; `source_name` names it in errors.
    pub fn load_str(&mut self, xml: &str, source_name: &str) -> Result<()> {
        let parsed: XmlConfiguration =
            serde_xml_rs::from_str(xml).map_err(|e| HdfsError::Config {
                source_name: source_name.to_string(),
                reason: format!("not a Hadoop <configuration> document: {e}"),
            })?;
        for (i, p) in parsed.properties.into_iter().enumerate() {
            let Some(name) = p
                .name
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
            else {
                return Err(HdfsError::Config {
                    source_name: source_name.to_string(),
                    reason: format!("<property> number {} has no <name>", i + 1),
                });
            };
            // Hadoop skips properties without a value.
            let Some(value) = p.value else { continue };
            let is_final = p
                .is_final
                .as_deref()
                .is_some_and(|f| f.trim().eq_ignore_ascii_case("true"));
            let name = current_name(&name).to_string();
            if self.finals.contains(&name) {
                tracing::warn!(
                    key = %name,
                    file = source_name,
                    "ignoring attempt to override a final Hadoop property"
                );
                continue;
            }
            self.props.insert(name.clone(), value.trim().to_string());
            self.sources.insert(name.clone(), source_name.to_string());
            if is_final {
                self.finals.insert(name);
            }
        }
        Ok(())
    }

    /// Sets a property (programmatic settings override files, `final` or not).
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        let key = current_name(key).to_string();
        self.props.insert(key.clone(), value.into());
        self.sources.insert(key, "programmatically".into());
        self
    }

    /// Overrides an emulated Java system property (`user.name`, ...) for `${...}`.
    pub fn set_system_property(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        self.system_overrides.insert(key.to_string(), value.into());
        self
    }

    /// Overrides an environment variable as seen by `${env.NAME}`.
    pub fn set_env(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        self.env_overrides.insert(key.to_string(), value.into());
        self
    }

    /// The value as written, without expansion.
    pub fn get_raw(&self, key: &str) -> Option<&str> {
        self.props.get(current_name(key)).map(String::as_str)
    }

    /// Where a key was set (a file path or `programmatically`).
    pub fn source_of(&self, key: &str) -> Option<&str> {
        self.sources.get(current_name(key)).map(String::as_str)
    }

    /// The expanded value of `key`, or `None` when unset.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        match self.get_raw(key) {
            None => Ok(None),
            Some(raw) => self.substitute(key, raw).map(Some),
        }
    }

    /// The expanded value, trimmed, or `default` when unset.
    pub fn get_or(&self, key: &str, default: &str) -> Result<String> {
        Ok(self
            .get(key)?
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| default.to_string()))
    }

    /// Comma-separated values, trimmed, empty entries dropped.
    pub fn get_list(&self, key: &str) -> Result<Vec<String>> {
        Ok(self
            .get(key)?
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    fn getenv(&self, name: &str) -> Option<String> {
        self.env_overrides
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }

    fn system_property(&self, name: &str) -> Option<String> {
        if let Some(v) = self.system_overrides.get(name) {
            return Some(v.clone());
        }
        match name {
            "user.name" => Some(os_user_name()),
            "user.home" => std::env::var("HOME").ok(),
            "user.dir" => std::env::current_dir()
                .ok()
                .map(|p| p.display().to_string()),
            "java.io.tmpdir" => Some(std::env::temp_dir().display().to_string()),
            _ => None,
        }
    }

    fn substitute(&self, key: &str, expr: &str) -> Result<String> {
        let mut eval = expr.to_string();
        for _ in 0..MAX_SUBST {
            let Some((start, end)) = find_sub_variable(&eval) else {
                return Ok(eval);
            };
            let var = &eval[start..end];
            let val = if let Some(spec) = var.strip_prefix("env.").filter(|s| !s.is_empty()) {
                if let Some(i) = spec.find(":-").filter(|&i| {
                    // The first ':' followed by '-' or first '-' decides, as in Hadoop.
                    spec.find('-').is_none_or(|d| d > i)
                }) {
                    match self.getenv(&spec[..i]) {
                        Some(v) if !v.is_empty() => Some(v),
                        _ => Some(spec[i + 2..].to_string()),
                    }
                } else if let Some(d) = spec.find('-') {
                    Some(
                        self.getenv(&spec[..d])
                            .unwrap_or_else(|| spec[d + 1..].to_string()),
                    )
                } else {
                    self.getenv(spec)
                }
            } else {
                self.system_property(var)
            };
            let val = match val.or_else(|| self.get_raw(var).map(str::to_string)) {
                Some(v) => v,
                None => return Ok(eval), // unbound: leave the rest as written
            };
            let reference = &eval[start - 2..end + 1];
            if val.contains(reference) {
                return Ok(expr.to_string()); // self-reference
            }
            eval = format!("{}{}{}", &eval[..start - 2], val, &eval[end + 1..]);
        }
        Err(HdfsError::Config {
            source_name: self
                .source_of(key)
                .map(|s| format!("{s}: {key}"))
                .unwrap_or_else(|| key.to_string()),
            reason: format!("variable substitution depth too large ({MAX_SUBST}) in {expr:?}"),
        })
    }

    /// `fs.defaultFS` (expanded), `file:///` when unset.
    pub fn default_fs(&self) -> Result<String> {
        self.get_or("fs.defaultFS", "file:///")
    }

    /// Whether `name` is a configured nameservice (listed in
    /// `dfs.nameservices` or having `dfs.ha.namenodes.<name>`).
    pub fn is_nameservice(&self, name: &str) -> Result<bool> {
        Ok(self.get_list("dfs.nameservices")?.iter().any(|n| n == name)
            || self.get_raw(&format!("dfs.ha.namenodes.{name}")).is_some())
    }

    /// The namenode HTTP base URLs (`http://host:port`) serving the file system
    /// named by `scheme://authority`, in failover order.
    ///
    /// - An empty authority (`hdfs:///path`) means `fs.defaultFS`.
    /// - A nameservice (no port) expands to `dfs.namenode.http-address.<ns>.<nn>`
    ///   for each `nn` in `dfs.ha.namenodes.<ns>`, or to
    ///   `dfs.namenode.http-address.<ns>` without HA.
    /// - `webhdfs://host:port` is that address (port 9870 when omitted).
    /// - `hdfs://host:rpcport` uses `dfs.namenode.http-address` when the URI
    ///   names the configured namenode, else the URI's host with the HTTP port
    ///   from `dfs.namenode.http-address` (9870 by default).
    pub fn namenode_http_addresses(&self, scheme: &Scheme, authority: &str) -> Result<Vec<String>> {
        let (scheme, authority) = if authority.is_empty() {
            let default_fs = self.default_fs()?;
            let err = || HdfsError::Config {
                source_name: "fs.defaultFS".into(),
                reason: format!(
                    "{}:/// with no host needs fs.defaultFS to name an HDFS, but it is {default_fs:?}",
                    scheme.as_str()
                ),
            };
            match crate::location::Location::parse(&default_fs) {
                Ok(crate::location::Location::Remote {
                    scheme, authority, ..
                }) if !authority.is_empty() => (scheme, authority),
                _ => return Err(err()),
            }
        } else {
            (scheme.clone(), authority.to_string())
        };
        let policy = self.get_or("dfs.http.policy", "HTTP_ONLY")?;
        if policy.eq_ignore_ascii_case("HTTPS_ONLY") {
            return Err(HdfsError::Config {
                source_name: "dfs.http.policy".into(),
                reason: "HTTPS_ONLY is not supported (this client speaks plain HTTP)".into(),
            });
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse::<u16>().ok()),
            None => (authority.clone(), None),
        };
        if port.is_none() && self.is_nameservice(&host)? {
            return self.nameservice_addresses(&host);
        }
        match scheme {
            Scheme::WebHdfs => Ok(vec![format!(
                "http://{host}:{}",
                port.unwrap_or(DEFAULT_NAMENODE_HTTP_PORT)
            )]),
            Scheme::Hdfs => {
                let configured = self.get("dfs.namenode.http-address")?;
                let names_configured_nn = self.names_configured_namenode(&authority)?;
                match configured {
                    Some(addr) => {
                        let (chost, cport) = split_host_port("dfs.namenode.http-address", &addr)?;
                        if names_configured_nn && !is_wildcard(&chost) {
                            Ok(vec![format!("http://{chost}:{cport}")])
                        } else {
                            Ok(vec![format!("http://{host}:{cport}")])
                        }
                    }
                    None => Ok(vec![format!("http://{host}:{DEFAULT_NAMENODE_HTTP_PORT}")]),
                }
            }
        }
    }

    /// Whether `authority` is the namenode named by `fs.defaultFS` or
    /// `dfs.namenode.rpc-address`.
    fn names_configured_namenode(&self, authority: &str) -> Result<bool> {
        let default_fs = self.default_fs()?;
        if let Ok(crate::location::Location::Remote { authority: a, .. }) =
            crate::location::Location::parse(&default_fs)
            && a == authority
        {
            return Ok(true);
        }
        Ok(self.get("dfs.namenode.rpc-address")?.as_deref() == Some(authority))
    }

    fn nameservice_addresses(&self, ns: &str) -> Result<Vec<String>> {
        let ha_key = format!("dfs.ha.namenodes.{ns}");
        let nns = self.get_list(&ha_key)?;
        if nns.is_empty() {
            let key = format!("dfs.namenode.http-address.{ns}");
            let Some(addr) = self.get(&key)? else {
                return Err(HdfsError::Config {
                    source_name: ha_key,
                    reason: format!(
                        "nameservice {ns:?} has neither {ha_key:?} nor {key:?}",
                        ha_key = format!("dfs.ha.namenodes.{ns}")
                    ),
                });
            };
            let (h, p) = split_host_port(&key, &addr)?;
            return Ok(vec![format!("http://{h}:{p}")]);
        }
        nns.iter()
            .map(|nn| {
                let key = format!("dfs.namenode.http-address.{ns}.{nn}");
                let addr = self.get(&key)?.ok_or_else(|| HdfsError::Config {
                    source_name: key.clone(),
                    reason: format!(
                        "namenode {nn:?} of nameservice {ns:?} (from {ha_key}) has no HTTP address"
                    ),
                })?;
                let (h, p) = split_host_port(&key, &addr)?;
                Ok(format!("http://{h}:{p}"))
            })
            .collect()
    }
}

fn current_name(key: &str) -> &str {
    DEPRECATED
        .iter()
        .find(|(old, _)| *old == key)
        .map(|(_, new)| *new)
        .unwrap_or(key)
}

fn is_wildcard(host: &str) -> bool {
    host == "0.0.0.0" || host == "::" || host == "[::]"
}

/// Splits a `host:port` configuration value (an `http://` prefix is tolerated).
fn split_host_port(key: &str, value: &str) -> Result<(String, u16)> {
    let v = value.trim();
    let v = v.strip_prefix("http://").unwrap_or(v).trim_end_matches('/');
    let err = || HdfsError::Config {
        source_name: key.to_string(),
        reason: format!("expected host:port, got {value:?}"),
    };
    let (h, p) = v.rsplit_once(':').ok_or_else(err)?;
    let port = p.parse::<u16>().map_err(|_| err())?;
    if h.is_empty() {
        return Err(err());
    }
    Ok((h.to_string(), port))
}

/// Finds the left-most `${var}` whose name has no `$`, `}` or space,
/// returning the byte range of `var` (Hadoop's `findSubVariable`).
fn find_sub_variable(eval: &str) -> Option<(usize, usize)> {
    let b = eval.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'$' && b[i + 1] == b'{' {
            let start = i + 2;
            let mut j = start;
            while j < b.len() {
                match b[j] {
                    b'}' if j > start => return Some((start, j)),
                    b'}' | b' ' | b'$' => break,
                    _ => j += 1,
                }
            }
            if j >= b.len() {
                return None;
            }
            i = if b[j] == b'$' { j } else { j + 1 };
        } else {
            i += 1;
        }
    }
    None
}

/// The OS user: `$USER`/`$LOGNAME`, else the password database entry of the
/// real user id, else `"unknown"`.
pub(crate) fn os_user_name() -> String {
    for var in ["USER", "LOGNAME"] {
        if let Ok(u) = std::env::var(var)
            && !u.is_empty()
        {
            return u;
        }
    }
    match nix::unistd::User::from_uid(nix::unistd::getuid()) {
        Ok(Some(u)) => u.name,
        _ => "unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CORE: &str = r#"<?xml version="1.0"?>
<?xml-stylesheet type="text/xsl" href="configuration.xsl"?>
<!-- a comment -->
<configuration>
  <property>
    <name>fs.defaultFS</name>
    <value>hdfs://mycluster</value>
    <final>true</final>
    <description>the default</description>
  </property>
  <property><name>hadoop.tmp.dir</name><value>/tmp/hadoop-${user.name}</value></property>
  <property><name>a</name><value>${b}/x</value></property>
  <property><name>b</name><value>${c}-y</value></property>
  <property><name>c</name><value>C</value></property>
  <property><name>self</name><value>pre ${self}</value></property>
  <property><name>unbound</name><value>${nope} and ${c}</value></property>
  <property><name>inner</name><value>${pre.${c}}</value></property>
  <property><name>pre.C</name><value>inner-ok</value></property>
  <property><name>envv</name><value>${env.CRUISE_TEST_VAR}|${env.CRUISE_UNSET_VAR:-dflt}|${env.CRUISE_EMPTY_VAR:-d2}|${env.CRUISE_EMPTY_VAR-d3}</value></property>
  <property><name>loop1</name><value>${loop2}</value></property>
  <property><name>loop2</name><value>${loop1}x</value></property>
  <property><name>novalue</name></property>
</configuration>"#;

    const HDFS: &str = r#"<configuration>
  <property><name>fs.defaultFS</name><value>hdfs://other</value></property>
  <property><name>dfs.nameservices</name><value>mycluster, solo</value></property>
  <property><name>dfs.ha.namenodes.mycluster</name><value>nn1,nn2</value></property>
  <property><name>nn.host</name><value>127.0.0.1</value></property>
  <property><name>dfs.namenode.http-address.mycluster.nn1</name><value>${nn.host}:1001</value></property>
  <property><name>dfs.namenode.http-address.mycluster.nn2</name><value>127.0.0.2:1002</value></property>
  <property><name>dfs.namenode.http-address.solo</name><value>solo-host:1003</value></property>
  <property><name>dfs.namenode.http-address</name><value>0.0.0.0:50070</value></property>
</configuration>"#;

    fn conf() -> HadoopConf {
        let mut c = HadoopConf::new();
        c.load_str(CORE, "core-site.xml").unwrap();
        c.load_str(HDFS, "hdfs-site.xml").unwrap();
        c.set_system_property("user.name", "alice");
        c.set_env("CRUISE_TEST_VAR", "tv");
        c.set_env("CRUISE_EMPTY_VAR", "");
        c
    }

    #[test]
    fn expands_like_hadoop() {
        let c = conf();
        assert_eq!(
            c.get("hadoop.tmp.dir").unwrap().unwrap(),
            "/tmp/hadoop-alice"
        );
        assert_eq!(c.get("a").unwrap().unwrap(), "C-y/x");
        assert_eq!(c.get("self").unwrap().unwrap(), "pre ${self}");
        assert_eq!(c.get("unbound").unwrap().unwrap(), "${nope} and ${c}");
        assert_eq!(c.get("inner").unwrap().unwrap(), "inner-ok");
        assert_eq!(c.get("envv").unwrap().unwrap(), "tv|dflt|d2|");
        assert!(c.get("novalue").unwrap().is_none());
        let err = c.get("loop1").unwrap_err().to_string();
        assert!(
            err.contains("core-site.xml: loop1") && err.contains("depth"),
            "{err}"
        );
    }

    #[test]
    fn final_is_kept_and_deprecated_names_map() {
        let c = conf();
        assert_eq!(c.default_fs().unwrap(), "hdfs://mycluster");
        let mut c2 = HadoopConf::new();
        c2.load_str(
            "<configuration><property><name>fs.default.name</name><value>hdfs://nn:8020</value></property></configuration>",
            "x.xml",
        )
        .unwrap();
        assert_eq!(c2.default_fs().unwrap(), "hdfs://nn:8020");
        assert_eq!(c2.source_of("fs.defaultFS"), Some("x.xml"));
    }

    #[test]
    fn resolves_namenodes() {
        let c = conf();
        assert_eq!(
            c.namenode_http_addresses(&Scheme::Hdfs, "mycluster")
                .unwrap(),
            vec!["http://127.0.0.1:1001", "http://127.0.0.2:1002"]
        );
        assert_eq!(
            c.namenode_http_addresses(&Scheme::Hdfs, "").unwrap(),
            vec!["http://127.0.0.1:1001", "http://127.0.0.2:1002"]
        );
        assert_eq!(
            c.namenode_http_addresses(&Scheme::WebHdfs, "mycluster")
                .unwrap(),
            vec!["http://127.0.0.1:1001", "http://127.0.0.2:1002"]
        );
        assert_eq!(
            c.namenode_http_addresses(&Scheme::Hdfs, "solo").unwrap(),
            vec!["http://solo-host:1003"]
        );
        assert_eq!(
            c.namenode_http_addresses(&Scheme::Hdfs, "nnhost:8020")
                .unwrap(),
            vec!["http://nnhost:50070"]
        );
        assert_eq!(
            c.namenode_http_addresses(&Scheme::WebHdfs, "h:1234")
                .unwrap(),
            vec!["http://h:1234"]
        );
        assert_eq!(
            HadoopConf::new()
                .namenode_http_addresses(&Scheme::WebHdfs, "h")
                .unwrap(),
            vec!["http://h:9870"]
        );
        let mut c3 = HadoopConf::new();
        c3.set("fs.defaultFS", "hdfs://nn1.example:8020")
            .set("dfs.namenode.http-address", "nn1-web.example:9871");
        assert_eq!(
            c3.namenode_http_addresses(&Scheme::Hdfs, "nn1.example:8020")
                .unwrap(),
            vec!["http://nn1-web.example:9871"]
        );
        assert_eq!(
            c3.namenode_http_addresses(&Scheme::Hdfs, "other:8020")
                .unwrap(),
            vec!["http://other:9871"]
        );
    }

    #[test]
    fn config_errors_name_the_key_or_file() {
        let mut c = HadoopConf::new();
        c.set("dfs.nameservices", "ns")
            .set("dfs.ha.namenodes.ns", "a,b");
        c.set("dfs.namenode.http-address.ns.a", "h:1");
        let err = c
            .namenode_http_addresses(&Scheme::Hdfs, "ns")
            .unwrap_err()
            .to_string();
        assert!(err.contains("dfs.namenode.http-address.ns.b"), "{err}");
        c.set("dfs.namenode.http-address.ns.b", "nonsense");
        let err = c
            .namenode_http_addresses(&Scheme::Hdfs, "ns")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dfs.namenode.http-address.ns.b") && err.contains("nonsense"),
            "{err}"
        );
        let err = HadoopConf::new()
            .namenode_http_addresses(&Scheme::Hdfs, "")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fs.defaultFS") && err.contains("file:///"),
            "{err}"
        );
        let err = HadoopConf::new()
            .load_str("<notconf><x/></notconf garbage", "bad-site.xml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad-site.xml"), "{err}");
        let err = HadoopConf::from_dir("/nonexistent/dir")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/dir"), "{err}");
    }

    #[test]
    fn reads_a_conf_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("core-site.xml"), CORE).unwrap();
        std::fs::write(dir.path().join("hdfs-site.xml"), HDFS).unwrap();
        let c = HadoopConf::from_dir(dir.path()).unwrap();
        assert_eq!(c.default_fs().unwrap(), "hdfs://mycluster");
        assert!(
            c.source_of("dfs.nameservices")
                .unwrap()
                .ends_with("hdfs-site.xml")
        );
        assert_eq!(
            c.get_list("dfs.nameservices").unwrap(),
            vec!["mycluster", "solo"]
        );
    }
}
