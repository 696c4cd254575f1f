package cruise.hadoop;

import java.util.Arrays;

import org.apache.hadoop.yarn.api.ApplicationConstants;
import org.apache.hadoop.yarn.api.records.ContainerId;
import org.apache.hadoop.yarn.api.records.FinalApplicationStatus;
import org.apache.hadoop.yarn.client.api.AMRMClient;
import org.apache.hadoop.yarn.conf.YarnConfiguration;

/**
 * Registers a non-JVM application master with the ResourceManager and runs
 * it: `java cruise.hadoop.AmRegistrar COMMAND ARGS...` in the AM container.
 *
 * <p>A YARN AM must register over the ApplicationMasterProtocol (Hadoop RPC,
 * authenticated with the AMRMToken the NodeManager hands the container),
 * heartbeat, and unregister with its final status; there is no REST
 * equivalent. Without it the RM keeps the application ACCEPTED, expires the
 * attempt after yarn.am.liveness-monitor.expiry-interval-ms, and records it
 * as FAILED when the container exits, whatever the AM did. This class does
 * exactly that for the `cruise appmaster` process it starts: it registers
 * (host NM_HOST, no RPC port, no tracking URL), heartbeats every second
 * while COMMAND runs, then unregisters with SUCCEEDED when COMMAND exits 0.
 * When COMMAND fails on the last attempt it unregisters with FAILED and the
 * exit status as diagnostics; on an earlier attempt it exits with COMMAND's
 * status without unregistering, so YARN starts the next attempt. When the
 * container is stopped (SIGTERM) it stops COMMAND first.
 *
 * <p>The RM addresses come from yarn-site.xml on the class path. Exit
 * status: COMMAND's.
 */
public final class AmRegistrar {
  private AmRegistrar() {}

  public static void main(String[] args) throws Exception {
    if (args.length == 0) {
      System.err.println("usage: AmRegistrar COMMAND [ARGS...]");
      System.exit(2);
    }
    // The AM's stdout is the container's stdout; Hadoop's own logging goes
    // to stderr.
    System.setOut(System.err);
    YarnConfiguration conf = new YarnConfiguration();
    String host = System.getenv(ApplicationConstants.Environment.NM_HOST.name());
    String cid = System.getenv(ApplicationConstants.Environment.CONTAINER_ID.name());
    if (cid == null) {
      System.err.println("cruise-am-registrar: CONTAINER_ID is not set: this runs in a YARN AM container");
      System.exit(2);
    }
    int attempt = ContainerId.fromString(cid).getApplicationAttemptId().getAttemptId();
    String max = System.getenv("MAX_APP_ATTEMPTS");
    int maxAttempts = max == null ? 1 : Integer.parseInt(max);

    AMRMClient<AMRMClient.ContainerRequest> rm = AMRMClient.createAMRMClient();
    rm.init(conf);
    rm.start();
    rm.registerApplicationMaster(host == null ? "" : host, 0, "");
    System.err.println("cruise-am-registrar: registered attempt " + attempt + " of " + maxAttempts
        + " with the RM at " + conf.get(YarnConfiguration.RM_SCHEDULER_ADDRESS)
        + "; running " + Arrays.toString(args));

    Process child = new ProcessBuilder(args).inheritIO().start();
    Thread stopper = new Thread(() -> {
      if (child.isAlive()) {
        child.destroy();
        try {
          child.waitFor();
        } catch (InterruptedException e) {
          child.destroyForcibly();
        }
      }
    }, "cruise-am-registrar-stop");
    Runtime.getRuntime().addShutdownHook(stopper);

    while (child.isAlive()) {
      rm.allocate(0.5f);
      child.waitFor(1, java.util.concurrent.TimeUnit.SECONDS);
    }
    int code = child.exitValue();
    if (code == 0) {
      rm.unregisterApplicationMaster(FinalApplicationStatus.SUCCEEDED, "", "");
    } else if (attempt >= maxAttempts) {
      rm.unregisterApplicationMaster(FinalApplicationStatus.FAILED,
          "cruise appmaster exited with status " + code + " (its stderr is in the AM container's logs)", "");
    } else {
      System.err.println("cruise-am-registrar: the AM exited with status " + code + " on attempt "
          + attempt + " of " + maxAttempts + "; leaving it to YARN to start the next");
      System.exit(code);
    }
    rm.stop();
    System.err.println("cruise-am-registrar: unregistered; the AM exited with status " + code);
    System.exit(code);
  }
}
