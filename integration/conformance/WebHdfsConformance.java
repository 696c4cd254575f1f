// Hadoop's own WebHDFS client (org.apache.hadoop.hdfs.web.WebHdfsFileSystem,
// from hadoop-client-api/-runtime 3.5) against the cruise-sim WebHDFS simulator.
//
// Usage: java -cp <jars>:<classes> WebHdfsConformance NAMENODE_HOST:PORT STANDBY_HOST:PORT SIM_ROOT
//
// The shaded 3.5 runtime ships the JAX-RS API but no implementation, so the
// first MediaType parse fails with ClassNotFoundException ...RuntimeDelegateImpl.
// MiniDelegate below is a test-only RuntimeDelegate that can only parse and
// print media types, which is all WebHdfsFileSystem needs.

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ContentSummary;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathIsNotEmptyDirectoryException;
import org.apache.hadoop.shaded.javax.ws.rs.core.MediaType;
import org.apache.hadoop.shaded.javax.ws.rs.ext.RuntimeDelegate;

public class WebHdfsConformance {
    /** Where the files go: $CONFORMANCE_BASE (default /conformance) + /java. */
    static final String BASE =
        (System.getenv("CONFORMANCE_BASE") == null ? "/conformance" : System.getenv("CONFORMANCE_BASE")) + "/java";
    /** The simulator's root directory, or "-" against a real HDFS (bytes are then read back through WebHDFS). */
    static String root;
    static FileSystem client;

    /** A RuntimeDelegate that only knows MediaType. */
    static final class MiniDelegate extends RuntimeDelegate {
        @Override public org.apache.hadoop.shaded.javax.ws.rs.core.UriBuilder createUriBuilder() { throw new UnsupportedOperationException(); }
        @Override public org.apache.hadoop.shaded.javax.ws.rs.core.Response.ResponseBuilder createResponseBuilder() { throw new UnsupportedOperationException(); }
        @Override public org.apache.hadoop.shaded.javax.ws.rs.core.Variant.VariantListBuilder createVariantListBuilder() { throw new UnsupportedOperationException(); }
        @Override public <T> T createEndpoint(org.apache.hadoop.shaded.javax.ws.rs.core.Application a, Class<T> c) { throw new UnsupportedOperationException(); }
        @Override public org.apache.hadoop.shaded.javax.ws.rs.core.Link.Builder createLinkBuilder() { throw new UnsupportedOperationException(); }

        @Override
        @SuppressWarnings("unchecked")
        public <T> HeaderDelegate<T> createHeaderDelegate(Class<T> type) {
            if (type != MediaType.class) {
                throw new IllegalArgumentException("MiniDelegate only handles MediaType, not " + type);
            }
            return (HeaderDelegate<T>) new HeaderDelegate<MediaType>() {
                @Override
                public MediaType fromString(String s) {
                    String[] parts = s.split(";");
                    String[] ts = parts[0].trim().split("/", 2);
                    Map<String, String> params = new HashMap<>();
                    for (int i = 1; i < parts.length; i++) {
                        String[] kv = parts[i].trim().split("=", 2);
                        if (kv.length == 2) {
                            params.put(kv[0].trim(), kv[1].trim().replace("\"", ""));
                        }
                    }
                    return new MediaType(ts[0], ts.length > 1 ? ts[1] : "*", params);
                }

                @Override
                public String toString(MediaType m) {
                    StringBuilder b = new StringBuilder(m.getType()).append('/').append(m.getSubtype());
                    m.getParameters().forEach((k, v) -> b.append(';').append(k).append('=').append(v));
                    return b.toString();
                }
            };
        }
    }

    static void check(boolean cond, String what) {
        if (!cond) {
            throw new AssertionError(what);
        }
        System.out.println("  ok  " + what);
    }

    interface Op { void run() throws Exception; }

    static void expect(Class<? extends Throwable> type, String what, Op op) throws Exception {
        try {
            op.run();
        } catch (Throwable t) {
            check(type.isInstance(t), what + " (got " + t.getClass().getSimpleName() + ": "
                + String.valueOf(t.getMessage()).split("\n")[0] + ")");
            return;
        }
        throw new AssertionError(what + ": no exception");
    }

    static byte[] onDisk(String path) throws IOException {
        if (root.equals("-")) {
            try (InputStream in = client.open(new Path(path))) {
                return in.readAllBytes();
            }
        }
        return Files.readAllBytes(Paths.get(root, path.substring(1)));
    }

    static byte[] bytes(String s) { return s.getBytes(StandardCharsets.UTF_8); }

    public static void main(String[] args) throws Exception {
        String nn = args[0], standby = args[1];
        root = args[2];
        RuntimeDelegate.setInstance(new MiniDelegate());

        Configuration conf = new Configuration();
        conf.setInt("dfs.http.client.retry.max.attempts", 2);
        conf.setInt("dfs.http.client.failover.sleep.base.millis", 10);
        conf.setInt("dfs.http.client.failover.sleep.max.millis", 50);
        FileSystem fs = FileSystem.get(URI.create("webhdfs://" + nn), conf, "alice");
        client = fs;
        check(fs.getClass().getName().equals("org.apache.hadoop.hdfs.web.WebHdfsFileSystem"),
            "FileSystem for webhdfs:// is WebHdfsFileSystem");

        // status
        check(fs.getFileStatus(new Path("/")).isDirectory(), "GETFILESTATUS / is a directory");

        // mkdirs
        Path dir = new Path(BASE + "/dir/sub");
        check(fs.mkdirs(dir), "MKDIRS returns true");
        FileStatus ds = fs.getFileStatus(dir);
        check(ds.isDirectory() && ds.getOwner().equals("alice"), "new directory owned by alice");

        // create (chunked PUT to the datanode)
        Path a = new Path(BASE + "/a.txt");
        try (FSDataOutputStream out = fs.create(a, false)) {
            out.write(bytes("hello world\n"));
        }
        check(Arrays.equals(onDisk(BASE + "/a.txt"), bytes("hello world\n")), "CREATE stored the bytes");
        FileStatus st = fs.getFileStatus(a);
        // Real HDFS keeps the replication the client asked for (its
        // dfs.replication, 3 by default); cruise-sim keeps none and says 1.
        short replication = root.equals("-") ? fs.getDefaultReplication(a) : 1;
        check(st.isFile() && st.getLen() == 12 && st.getOwner().equals("alice")
            && st.getPermission().toShort() == 0644 && st.getReplication() == replication,
            "GETFILESTATUS of the new file: 12 bytes, alice, 644, replication " + replication);
        expect(FileAlreadyExistsException.class, "CREATE without overwrite on an existing file",
            () -> { try (FSDataOutputStream out = fs.create(a, false)) { out.write(1); } });
        try (FSDataOutputStream out = fs.create(a, true)) {
            out.write(bytes("0123456789\n"));
        }
        check(Arrays.equals(onDisk(BASE + "/a.txt"), bytes("0123456789\n")), "CREATE overwrite replaced the file");

        // append
        try (FSDataOutputStream out = fs.append(a)) {
            out.write(bytes("appended\n"));
        }
        check(Arrays.equals(onDisk(BASE + "/a.txt"), bytes("0123456789\nappended\n")), "APPEND added the bytes");

        // read: whole, seek, positional (OPEN with offset)
        try (FSDataInputStream in = fs.open(a)) {
            byte[] all = new byte[20];
            in.readFully(all);
            check(Arrays.equals(all, bytes("0123456789\nappended\n")), "OPEN reads the whole file");
            check(in.read() == -1, "EOF after the last byte");
            in.seek(11);
            byte[] tail = new byte[8];
            in.readFully(tail);
            check(new String(tail, StandardCharsets.UTF_8).equals("appended"), "seek(11) then read");
            byte[] mid = new byte[4];
            in.readFully(3, mid);
            check(new String(mid, StandardCharsets.UTF_8).equals("3456"), "positional read at offset 3");
        }

        // list
        FileStatus[] ls = fs.listStatus(new Path(BASE));
        List<String> names = new ArrayList<>();
        for (FileStatus s : ls) names.add(s.getPath().getName() + (s.isDirectory() ? "/" : ":" + s.getLen()));
        check(names.equals(Arrays.asList("a.txt:20", "dir/")), "LISTSTATUS " + names);
        FileStatus[] one = fs.listStatus(a);
        check(one.length == 1 && one[0].getLen() == 20, "LISTSTATUS of a file lists the file");

        // content summary
        ContentSummary cs = fs.getContentSummary(new Path(BASE));
        check(cs.getLength() == 20 && cs.getFileCount() == 1 && cs.getDirectoryCount() == 3,
            "GETCONTENTSUMMARY counts");
        check(fs.getHomeDirectory().toUri().getPath().equals("/user/alice"), "GETHOMEDIRECTORY");

        // rename
        Path b = new Path(BASE + "/b.txt");
        check(fs.rename(a, b), "RENAME returns true");
        check(!fs.exists(a) && fs.getFileStatus(b).getLen() == 20, "RENAME moved the file");
        check(!fs.rename(new Path(BASE + "/missing"), new Path(BASE + "/x")), "RENAME of a missing source returns false");
        check(fs.rename(b, new Path(BASE + "/dir")), "RENAME into a directory");
        check(fs.getFileStatus(new Path(BASE + "/dir/b.txt")).getLen() == 20, "moved inside the directory");

        // delete
        expect(PathIsNotEmptyDirectoryException.class, "DELETE of a non-empty directory without recursive",
            () -> fs.delete(new Path(BASE + "/dir"), false));
        check(fs.delete(new Path(BASE + "/dir"), true), "DELETE recursive returns true");
        check(!fs.delete(new Path(BASE + "/dir"), true), "DELETE of a missing path returns false");
        if (root.equals("-")) {
            check(!fs.exists(new Path(BASE + "/dir")), "DELETE removed it");
        } else {
            check(!Files.exists(Paths.get(root, BASE.substring(1), "dir")), "DELETE removed it on disk");
        }

        // errors
        expect(FileNotFoundException.class, "GETFILESTATUS of a missing path",
            () -> fs.getFileStatus(new Path(BASE + "/missing")));
        expect(FileNotFoundException.class, "OPEN of a missing path",
            () -> { try (InputStream in = fs.open(new Path(BASE + "/missing"))) { in.read(); } });

        // HA: a nameservice whose first namenode is a standby (none on a real HDFS: "-")
        if (standby.equals("-")) {
            fs.delete(new Path(BASE), true);
            fs.close();
            System.out.println("java: all checks passed (no standby)");
            return;
        }
        Configuration ha = new Configuration(conf);
        ha.set("dfs.nameservices", "sandbox");
        ha.set("dfs.ha.namenodes.sandbox", "nn1,nn2");
        ha.set("dfs.namenode.http-address.sandbox.nn1", standby);
        ha.set("dfs.namenode.http-address.sandbox.nn2", nn);
        // WebHdfsFileSystem treats the authority as logical only when client
        // failover is configured for it.
        ha.set("dfs.client.failover.proxy.provider.sandbox",
            "org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider");
        FileSystem hafs = FileSystem.newInstance(URI.create("webhdfs://sandbox"), ha, "alice");
        check(hafs.getFileStatus(new Path(BASE)).isDirectory(), "failover from the standby namenode");
        hafs.close();

        fs.close();
        System.out.println("java: all checks passed");
    }
}
