package cruise.hadoop;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.DFSConfigKeys;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.registry.client.api.RegistryConstants;
import org.apache.hadoop.registry.server.services.MicroZookeeperService;
import org.apache.hadoop.registry.server.services.MicroZookeeperServiceKeys;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

/**
 * A one-machine Hadoop: a MiniDFSCluster (one NameNode, one DataNode, WebHDFS
 * on) and a MiniYARNCluster (one ResourceManager with its web services and the
 * YARN Services REST API; N NodeManagers, each in a JVM of its own, that
 * launch real processes with the DefaultContainerExecutor), plus the
 * in-process ZooKeeper that the YARN service registry needs.
 *
 * <pre>java -cp CONFDIR:cruise-hadoop.jar:DEPS cruise.hadoop.Launcher DIR [NODEMANAGERS]</pre>
 *
 * CONFDIR must be DIR/classpath-conf and come first on the class path: the
 * Services REST API (ApiServer) and the service AMs it launches read their
 * configuration from core-site.xml and yarn-site.xml found on the class path,
 * so the launcher writes both there, with every address fixed, before it
 * starts anything. When all is up it writes DIR/hadoop-conf (the
 * HADOOP_CONF_DIR for clients), DIR/cluster.env (the addresses, for scripts)
 * and last DIR/ready (its pid). The NodeManagers log to DIR/logs; the
 * system properties cruise.nm.memory.mb, cruise.nm.vcores and
 * cruise.add.opens (JVM options for the JVMs it starts) configure them. It
 * stops everything on SIGTERM or SIGINT.
 */
public final class Launcher {
  private Launcher() {}

  /** A free TCP port on the loopback interface. */
  private static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket()) {
      s.setReuseAddress(true);
      s.bind(new InetSocketAddress("127.0.0.1", 0));
      return s.getLocalPort();
    }
  }

  /** n distinct free TCP ports on the loopback interface. */
  private static int[] freePorts(int n) throws IOException {
    ServerSocket[] held = new ServerSocket[n];
    int[] ports = new int[n];
    try {
      for (int i = 0; i < n; i++) {
        held[i] = new ServerSocket();
        held[i].setReuseAddress(true);
        held[i].bind(new InetSocketAddress("127.0.0.1", 0));
        ports[i] = held[i].getLocalPort();
      }
    } finally {
      for (ServerSocket s : held) {
        if (s != null) {
          s.close();
        }
      }
    }
    return ports;
  }

  /** Writes text to path through a temporary file, so readers never see half of it. */
  private static void writeAtomically(Path path, String text) throws IOException {
    Path tmp = path.resolveSibling(path.getFileName() + ".tmp");
    Files.write(tmp, text.getBytes(StandardCharsets.UTF_8));
    Files.move(tmp, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
  }

  private static String site(Map<String, String> props) {
    StringBuilder b = new StringBuilder("<?xml version=\"1.0\"?>\n<configuration>\n");
    for (Map.Entry<String, String> e : props.entrySet()) {
      b.append("  <property><name>").append(e.getKey()).append("</name><value>")
          .append(e.getValue()).append("</value></property>\n");
    }
    return b.append("</configuration>\n").toString();
  }

  private static void writeConf(Configuration conf, Path path) throws IOException {
    Path tmp = path.resolveSibling(path.getFileName() + ".tmp");
    try (OutputStream os = new FileOutputStream(tmp.toFile())) {
      conf.writeXml(os);
    }
    Files.move(tmp, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
  }

  private static final java.util.List<Process> nmProcesses =
      java.util.Collections.synchronizedList(new java.util.ArrayList<>());

  /**
   * Starts NodeManager number index as a JVM of its own, with a class path
   * that starts with its own configuration directory DIR/nm-INDEX/conf.
   */
  private static Process startNodeManager(Path dir, int index, Map<String, String> core,
      Map<String, String> yarn, int memoryMb, int vcores) throws IOException {
    Path nmDir = dir.resolve("nm-" + index);
    Path conf = nmDir.resolve("conf");
    Files.createDirectories(conf);
    Files.createDirectories(nmDir.resolve("local"));
    Files.createDirectories(nmDir.resolve("logs"));
    Files.createDirectories(dir.resolve("logs"));
    Map<String, String> nm = new LinkedHashMap<>(yarn);
    nm.remove(YarnConfiguration.YARN_MINICLUSTER_FIXED_PORTS);
    nm.remove(YarnConfiguration.IS_MINI_YARN_CLUSTER);
    nm.put(YarnConfiguration.NM_ADDRESS, "127.0.0.1:0");
    nm.put(YarnConfiguration.NM_LOCALIZER_ADDRESS, "127.0.0.1:" + freePort());
    nm.put(YarnConfiguration.NM_WEBAPP_ADDRESS, "127.0.0.1:" + freePort());
    nm.put(YarnConfiguration.NM_LOCAL_DIRS, nmDir.resolve("local").toString());
    nm.put(YarnConfiguration.NM_LOG_DIRS, nmDir.resolve("logs").toString());
    nm.put(YarnConfiguration.NM_PMEM_MB, String.valueOf(memoryMb));
    nm.put(YarnConfiguration.NM_VCORES, String.valueOf(vcores));
    nm.put(YarnConfiguration.NM_RECOVERY_ENABLED, "false");
    nm.put(YarnConfiguration.NM_CONTAINER_EXECUTOR,
        "org.apache.hadoop.yarn.server.nodemanager.DefaultContainerExecutor");
    writeAtomically(conf.resolve("core-site.xml"), site(core));
    writeAtomically(conf.resolve("yarn-site.xml"), site(nm));
    String javaHome = System.getProperty("java.home");
    java.util.List<String> cmd = new java.util.ArrayList<>();
    cmd.add(javaHome + "/bin/java");
    cmd.add("-Xmx256m");
    for (String o : System.getProperty("cruise.add.opens", "").split(" ")) {
      if (!o.isEmpty()) {
        cmd.add(o);
      }
    }
    cmd.add("-Dhadoop.log.dir=" + dir.resolve("logs"));
    cmd.add("-Dyarn.log.dir=" + dir.resolve("logs"));
    cmd.add("-cp");
    String cp = System.getProperty("java.class.path");
    // Drop the RM's configuration directory: the NodeManager has its own.
    String own = dir.resolve("classpath-conf").toString();
    StringBuilder nmCp = new StringBuilder(conf.toString());
    for (String e : cp.split(java.io.File.pathSeparator)) {
      if (!e.equals(own)) {
        nmCp.append(java.io.File.pathSeparator).append(e);
      }
    }
    cmd.add(nmCp.toString());
    cmd.add("org.apache.hadoop.yarn.server.nodemanager.NodeManager");
    ProcessBuilder pb = new ProcessBuilder(cmd).directory(nmDir.toFile())
        .redirectErrorStream(true)
        .redirectOutput(dir.resolve("logs").resolve("nodemanager-" + index + ".log").toFile());
    pb.environment().put("JAVA_HOME", javaHome);
    return pb.start();
  }

  public static void main(String[] args) {
    try {
      run(args);
    } catch (Throwable t) {
      // Threads of the half-started clusters would keep the JVM alive.
      System.err.println("cruise-hadoop: failed to start: " + t);
      t.printStackTrace();
      System.exit(1);
    }
  }

  private static void run(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: Launcher DIR [NODEMANAGERS]");
      System.exit(2);
    }
    Path dir = Path.of(args[0]).toAbsolutePath();
    int nodeManagers = args.length > 1 ? Integer.parseInt(args[1]) : 1;
    int nmMemoryMb = Integer.parseInt(System.getProperty("cruise.nm.memory.mb", "6144"));
    int nmVcores = Integer.parseInt(System.getProperty("cruise.nm.vcores", "8"));
    Path cpConf = dir.resolve("classpath-conf");
    Path clientConf = dir.resolve("hadoop-conf");
    Files.createDirectories(cpConf);
    Files.createDirectories(clientConf);
    Files.deleteIfExists(dir.resolve("ready"));
    String user = System.getProperty("user.name");
    String host = "127.0.0.1";

    // Every port of HDFS and the RM, picked together (held until all are
    // picked, so no two are the same) and fixed in the configuration, so no
    // daemon's ephemeral port can take one of them before its owner binds it.
    int[] ports = freePorts(10);
    int nnRpc = ports[5];
    int nnHttp = ports[6];
    int dnXfer = ports[7];
    int dnIpc = ports[8];
    int dnHttp = ports[9];
    int[] rmPorts = ports;
    int rm = rmPorts[0];
    int rmScheduler = rmPorts[1];
    int rmTracker = rmPorts[2];
    int rmAdmin = rmPorts[3];
    int rmWeb = rmPorts[4];

    // ZooKeeper for the YARN service registry (the service AM registers its
    // containers there).
    Configuration zkConf = new Configuration(false);
    zkConf.set(MicroZookeeperServiceKeys.KEY_ZKSERVICE_DIR, dir.resolve("zookeeper").toString());
    zkConf.set(MicroZookeeperServiceKeys.KEY_ZKSERVICE_HOST, host);
    MicroZookeeperService zk = new MicroZookeeperService("cruise-zk");
    zk.init(zkConf);
    zk.start();
    String quorum = zk.getConnectionString();

    Map<String, String> core = new LinkedHashMap<>();
    core.put("fs.defaultFS", "hdfs://" + host + ":" + nnRpc);
    core.put("hadoop.proxyuser." + user + ".hosts", "*");
    core.put("hadoop.proxyuser." + user + ".groups", "*");
    core.put("hadoop.proxyuser." + user + ".users", "*");
    core.put(RegistryConstants.KEY_REGISTRY_ZK_QUORUM, quorum);

    Map<String, String> yarn = new LinkedHashMap<>();
    yarn.put(YarnConfiguration.YARN_MINICLUSTER_FIXED_PORTS, "true");
    // Tells the Services API to give the service AM this JVM's class path.
    yarn.put(YarnConfiguration.IS_MINI_YARN_CLUSTER, "true");
    yarn.put(YarnConfiguration.RM_ADDRESS, host + ":" + rm);
    yarn.put(YarnConfiguration.RM_SCHEDULER_ADDRESS, host + ":" + rmScheduler);
    yarn.put(YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS, host + ":" + rmTracker);
    yarn.put(YarnConfiguration.RM_ADMIN_ADDRESS, host + ":" + rmAdmin);
    yarn.put(YarnConfiguration.RM_WEBAPP_ADDRESS, host + ":" + rmWeb);
    yarn.put(YarnConfiguration.RM_ZK_ADDRESS, quorum);
    yarn.put("yarn.webapp.api-service.enable", "true");
    yarn.put(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, "128");
    yarn.put(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, String.valueOf(nmMemoryMb));
    yarn.put(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, String.valueOf(nmVcores));
    yarn.put(YarnConfiguration.NM_VCORES, String.valueOf(nmVcores));
    yarn.put(YarnConfiguration.NM_AUX_SERVICES, "");
    yarn.put(YarnConfiguration.NM_PMEM_CHECK_ENABLED, "false");
    yarn.put(YarnConfiguration.NM_VMEM_CHECK_ENABLED, "false");
    yarn.put(YarnConfiguration.NM_MAX_PER_DISK_UTILIZATION_PERCENTAGE, "100");
    yarn.put(YarnConfiguration.TIMELINE_SERVICE_ENABLED, "false");
    yarn.put(YarnConfiguration.LOG_AGGREGATION_ENABLED, "false");
    yarn.put(YarnConfiguration.NM_LOG_RETAIN_SECONDS, "3600");
    yarn.put(YarnConfiguration.RM_AM_MAX_ATTEMPTS, "2");
    // The service AM: small, and on Java 17 the Hadoop libraries need these
    // packages opened.
    yarn.put("yarn.service.am-resource.memory", "512");
    yarn.put("yarn.service.am.java.opts", "-Xmx384m " + System.getProperty("cruise.add.opens", ""));
    yarn.put("yarn.service.readiness-check-interval.seconds", "1");
    yarn.put(YarnConfiguration.RM_NM_HEARTBEAT_INTERVAL_MS, "250");
    yarn.put(YarnConfiguration.RM_NM_EXPIRY_INTERVAL_MS, "60000");

    Map<String, String> all = new LinkedHashMap<>(core);
    all.putAll(yarn);
    writeAtomically(cpConf.resolve("core-site.xml"), site(core));
    writeAtomically(cpConf.resolve("yarn-site.xml"), site(all));

    // HDFS.
    HdfsConfiguration hconf = new HdfsConfiguration();
    hconf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, dir.resolve("dfs").toString());
    hconf.set(DFSConfigKeys.DFS_NAMENODE_HTTP_ADDRESS_KEY, host + ":" + nnHttp);
    hconf.set(DFSConfigKeys.DFS_DATANODE_HTTP_ADDRESS_KEY, host + ":" + dnHttp);
    hconf.set(DFSConfigKeys.DFS_DATANODE_ADDRESS_KEY, host + ":" + dnXfer);
    hconf.set(DFSConfigKeys.DFS_DATANODE_IPC_ADDRESS_KEY, host + ":" + dnIpc);
    hconf.setBoolean("dfs.webhdfs.enabled", true);
    hconf.setInt(DFSConfigKeys.DFS_REPLICATION_KEY, 1);
    hconf.setBoolean(DFSConfigKeys.DFS_PERMISSIONS_ENABLED_KEY, true);
    // One DataNode: a file a client created with replication 3 (Hadoop's
    // client default) could not be appended to, since the write pipeline
    // would look for DataNodes to add. As for any cluster of fewer than 3.
    hconf.set("dfs.client.block.write.replace-datanode-on-failure.policy", "NEVER");
    hconf.set("hadoop.proxyuser." + user + ".hosts", "*");
    hconf.set("hadoop.proxyuser." + user + ".groups", "*");
    MiniDFSCluster dfs = new MiniDFSCluster.Builder(hconf)
        .nameNodePort(nnRpc)
        .nameNodeHttpPort(nnHttp)
        .numDataNodes(1)
        .checkDataNodeAddrConfig(true)
        .format(true)
        .build();
    dfs.waitActive();
    // Directories every user may write, as on a fresh cluster.
    org.apache.hadoop.fs.FileSystem fs = dfs.getFileSystem();
    for (String p : new String[] {"/tmp", "/user"}) {
      fs.mkdirs(new org.apache.hadoop.fs.Path(p));
      fs.setPermission(new org.apache.hadoop.fs.Path(p),
          new org.apache.hadoop.fs.permission.FsPermission((short) 01777));
    }

    // YARN: the ResourceManager in this JVM (a MiniYARNCluster without
    // NodeManagers), each NodeManager in a JVM of its own. Web apps of the RM
    // and of a NodeManager cannot share a JVM: Guice's servlet filter is
    // static, and the last web app started takes the requests of all of them.
    YarnConfiguration yconf = new YarnConfiguration();
    for (Map.Entry<String, String> e : all.entrySet()) {
      yconf.set(e.getKey(), e.getValue());
    }
    MiniYARNCluster yarnCluster = new MiniYARNCluster("cruise", 1, 0, 1, 1);
    yarnCluster.init(yconf);
    yarnCluster.start();
    for (int i = 0; i < nodeManagers; i++) {
      nmProcesses.add(startNodeManager(dir, i, core, yarn, nmMemoryMb, nmVcores));
    }
    long deadline = System.currentTimeMillis() + 120_000;
    while (yarnCluster.getResourceManager().getRMContext().getRMNodes().size() < nodeManagers) {
      for (Process p : nmProcesses) {
        if (!p.isAlive()) {
          throw new IllegalStateException("a NodeManager exited with status " + p.exitValue()
              + " before registering; see " + dir.resolve("logs"));
        }
      }
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException(nodeManagers + " NodeManagers did not register with the RM in 120 s; see "
            + dir.resolve("logs"));
      }
      Thread.sleep(200);
    }
    writeConf(yarnCluster.getConfig(), dir.resolve("effective-yarn-site.xml"));

    // The client's HADOOP_CONF_DIR.
    Map<String, String> clientCore = new LinkedHashMap<>();
    clientCore.put("fs.defaultFS", "hdfs://" + host + ":" + nnRpc);
    Map<String, String> clientHdfs = new LinkedHashMap<>();
    clientHdfs.put(DFSConfigKeys.DFS_NAMENODE_HTTP_ADDRESS_KEY, host + ":" + nnHttp);
    clientHdfs.put(DFSConfigKeys.DFS_NAMENODE_RPC_ADDRESS_KEY, host + ":" + nnRpc);
    clientHdfs.put(DFSConfigKeys.DFS_REPLICATION_KEY, "1");
    Map<String, String> clientYarn = new LinkedHashMap<>();
    clientYarn.put(YarnConfiguration.RM_ADDRESS, host + ":" + rm);
    clientYarn.put(YarnConfiguration.RM_SCHEDULER_ADDRESS, host + ":" + rmScheduler);
    clientYarn.put(YarnConfiguration.RM_WEBAPP_ADDRESS, host + ":" + rmWeb);
    clientYarn.put(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, "128");
    // Where a JVM in a container finds Hadoop: this JVM's class path (the
    // Maven repository), its configuration directory first.
    clientYarn.put(YarnConfiguration.YARN_APPLICATION_CLASSPATH,
        System.getProperty("java.class.path").replace(File.pathSeparatorChar, ','));
    writeAtomically(clientConf.resolve("core-site.xml"), site(clientCore));
    writeAtomically(clientConf.resolve("hdfs-site.xml"), site(clientHdfs));
    writeAtomically(clientConf.resolve("yarn-site.xml"), site(clientYarn));

    StringBuilder env = new StringBuilder();
    env.append("NN_RPC=").append(host).append(':').append(nnRpc).append('\n');
    env.append("NN_HTTP=").append(host).append(':').append(nnHttp).append('\n');
    env.append("RM_WEB=").append(host).append(':').append(rmWeb).append('\n');
    env.append("RM_RPC=").append(host).append(':').append(rm).append('\n');
    env.append("ZK=").append(quorum).append('\n');
    env.append("NODEMANAGERS=").append(nodeManagers).append('\n');
    env.append("NM_MEMORY_MB=").append(nmMemoryMb).append('\n');
    env.append("NM_VCORES=").append(nmVcores).append('\n');
    env.append("HDFS_USER=").append(user).append('\n');
    writeAtomically(dir.resolve("cluster.env"), env.toString());

    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      System.err.println("cruise-hadoop: stopping");
      synchronized (nmProcesses) {
        for (Process p : nmProcesses) {
          p.destroy();
        }
        for (Process p : nmProcesses) {
          try {
            if (!p.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)) {
              p.destroyForcibly();
            }
          } catch (InterruptedException e) {
            p.destroyForcibly();
          }
        }
      }
      try {
        yarnCluster.stop();
      } catch (RuntimeException e) {
        e.printStackTrace();
      }
      try {
        dfs.shutdown();
      } catch (RuntimeException e) {
        e.printStackTrace();
      }
      try {
        zk.stop();
      } catch (RuntimeException e) {
        e.printStackTrace();
      }
      System.err.println("cruise-hadoop: stopped");
      stopped.countDown();
    }, "cruise-hadoop-stop"));

    try (PrintWriter w = new PrintWriter(dir.resolve("ready.tmp").toFile(), StandardCharsets.UTF_8)) {
      w.println(ProcessHandle.current().pid());
    }
    Files.move(dir.resolve("ready.tmp"), dir.resolve("ready"), StandardCopyOption.ATOMIC_MOVE);
    System.err.println("cruise-hadoop: ready; WebHDFS http://" + host + ":" + nnHttp
        + ", RM http://" + host + ":" + rmWeb + ", " + nodeManagers + " NodeManagers");
    stopped.await();
  }
}
