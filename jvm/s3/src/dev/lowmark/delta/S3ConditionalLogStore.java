/*
 * lowmark's Delta log store for S3-compatible stores with more than one writer.
 *
 * Delta commits version N of a table by creating _delta_log/N.json, which must fail when
 * the file exists: that is how one of two writers committing the same version loses and
 * retries on the next. Delta's S3SingleDriverLogStore checks in the JVM, so two JVMs can
 * both "create" N.json on S3, the later one replacing the earlier commit. This store makes
 * the create itself the check: a conditional put (If-None-Match: *, S3A's
 * fs.option.create.conditional.overwrite, Hadoop 3.5), which the store refuses with 412
 * when N.json exists; that refusal is Delta's FileAlreadyExistsException. Needs a store
 * that honours If-None-Match on PUT (AWS S3 since 2024, MinIO, Cloudflare R2, Ceph RGW).
 *
 * Configured by lowmark.state.storage (spark.delta.logStore.s3a.impl) and built by
 * `make integration-setup` into jvm/s3/lib.
 */
package dev.lowmark.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

public class S3ConditionalLogStore extends HadoopFileSystemLogStore {

  public S3ConditionalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(
      Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
    if (!overwrite) {
      builder.must(Options.CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE, true);
    }
    try (FSDataOutputStream stream = builder.build()) {
      while (actions.hasNext()) {
        stream.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
      }
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      throw taken(path, e); // seen before the put (S3A's own check)
    } catch (RemoteFileChangedException e) {
      if (overwrite) {
        throw e;
      }
      throw taken(path, e); // the put refused: 412, another writer created it first
    }
  }

  private static FileAlreadyExistsException taken(Path path, IOException cause) {
    FileAlreadyExistsException taken = new FileAlreadyExistsException(path.toString());
    taken.initCause(cause);
    return taken;
  }

  /** A put is all or nothing on S3: no reader sees half a commit. */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }
}
