/*
 * A Spark file commit protocol for outputs whose commit is a manifest written after the job: every task
 * writes its files straight to their final place under a name of its own (split and attempt number), and
 * the job commit writes the list of the files that Spark's committed tasks wrote.
 *
 * Why: Hadoop's committers write each file under _temporary/ and move it at task commit. On an object
 * store a move is a copy of every byte and a delete, plus listings and probes around it. An attempt's
 * exchange prefix belongs to that attempt alone and counts only once the provider's manifest names its
 * files, so nothing needs moving: the manifest is built from this list, and a file no committed task
 * wrote (an aborted task's, a losing speculative copy's, even one closed after the job ended) is never
 * named. Spark's output commit coordinator still lets exactly one attempt of each task commit.
 *
 * Not supported (refused, never silently different): dynamic partition overwrite and files outside the
 * output path (custom partition locations).
 */
package speculative.commit;

import java.io.IOException;
import java.io.OutputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;

import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.spark.internal.io.FileCommitProtocol;
import org.apache.spark.internal.io.FileNameSpec;

import scala.Option;
import scala.collection.Iterator;
import scala.collection.immutable.Seq;

/** Direct writes under per-attempt names, committed by a list of the committed tasks' files. */
public class DirectCommitProtocol extends FileCommitProtocol implements Serializable {
    private static final long serialVersionUID = 1L;

    /** The list the job commit writes below the output path: one relative file name per line. */
    public static final String COMMITTED_LIST = "_speculative_committed";

    private final String jobId;
    private final String path;
    /** Files this task attempt wrote, relative to the output path (executor side, one instance per task). */
    private transient List<String> written;

    /** Spark instantiates the protocol with its job id, the output path and the overwrite mode. */
    public DirectCommitProtocol(String jobId, String path, boolean dynamicPartitionOverwrite) {
        if (dynamicPartitionOverwrite) {
            throw new UnsupportedOperationException(
                "DirectCommitProtocol does not support dynamic partition overwrite (output " + path + ")");
        }
        if (path == null || path.isEmpty()) {
            throw new IllegalArgumentException("DirectCommitProtocol needs an output path");
        }
        this.jobId = jobId;
        this.path = path;
    }

    @Override
    public void setupJob(JobContext jobContext) {
        // Nothing to prepare: no staging directory, files go straight to their final names.
    }

    @Override
    public void setupTask(TaskAttemptContext taskContext) {
        written = new ArrayList<>();
    }

    /** The file name of this task attempt: Spark's ``part-<split>-<job>`` plus the attempt number. */
    static String fileName(TaskAttemptContext taskContext, String jobId, FileNameSpec spec) {
        TaskAttemptID attempt = taskContext.getTaskAttemptID();
        return spec.prefix() + String.format("part-%05d-%s-a%d", attempt.getTaskID().getId(), jobId, attempt.getId())
            + spec.suffix();
    }

    @Override
    public String newTaskTempFile(TaskAttemptContext taskContext, Option<String> dir, FileNameSpec spec) {
        String name = fileName(taskContext, jobId, spec);
        String relative = dir.isDefined() ? dir.get() + "/" + name : name;
        if (written == null) {
            written = new ArrayList<>();
        }
        written.add(relative);
        return new Path(path, relative).toString();
    }

    @Override
    @SuppressWarnings("deprecation")
    public String newTaskTempFile(TaskAttemptContext taskContext, Option<String> dir, String ext) {
        return newTaskTempFile(taskContext, dir, new FileNameSpec("", ext));
    }

    @Override
    public String newTaskTempFileAbsPath(TaskAttemptContext taskContext, String absoluteDir, FileNameSpec spec) {
        throw new UnsupportedOperationException(
            "DirectCommitProtocol writes below its output path only, not to " + absoluteDir);
    }

    @Override
    @SuppressWarnings("deprecation")
    public String newTaskTempFileAbsPath(TaskAttemptContext taskContext, String absoluteDir, String ext) {
        return newTaskTempFileAbsPath(taskContext, absoluteDir, new FileNameSpec("", ext));
    }

    @Override
    public FileCommitProtocol.TaskCommitMessage commitTask(TaskAttemptContext taskContext) {
        List<String> files = written == null ? new ArrayList<>() : written;
        return new FileCommitProtocol.TaskCommitMessage(files.toArray(new String[0]));
    }

    @Override
    public void abortTask(TaskAttemptContext taskContext) {
        // Best effort: the files carry this attempt's own name, and no list will name them either way.
        if (written == null) {
            return;
        }
        try {
            FileSystem fs = new Path(path).getFileSystem(taskContext.getConfiguration());
            for (String relative : written) {
                fs.delete(new Path(path, relative), false);
            }
        } catch (IOException | RuntimeException e) {
            // An aborted task's file that stays behind is never named by the list: nothing depends on it.
        }
    }

    @Override
    public void commitJob(JobContext jobContext, Seq<FileCommitProtocol.TaskCommitMessage> taskCommits) {
        TreeSet<String> names = new TreeSet<>();
        Iterator<FileCommitProtocol.TaskCommitMessage> it = taskCommits.iterator();
        while (it.hasNext()) {
            Object obj = it.next().obj();
            if (!(obj instanceof String[])) {
                throw new IllegalStateException("DirectCommitProtocol: a task committed an unexpected message: " + obj);
            }
            for (String name : (String[]) obj) {
                names.add(name);
            }
        }
        StringBuilder text = new StringBuilder();
        for (String name : names) {
            text.append(name).append('\n');
        }
        Path list = new Path(path, COMMITTED_LIST);
        // overwrite=false: the output path is new for every job that uses this protocol; a list already
        // there means a second job wrote to the same place, which must fail rather than merge.
        try (OutputStream out = list.getFileSystem(jobContext.getConfiguration()).create(list, false)) {
            out.write(text.toString().getBytes(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new UncheckedIOException("DirectCommitProtocol: cannot write " + list, e);
        }
    }

    @Override
    public void abortJob(JobContext jobContext) {
        // Nothing to undo: without the list no file below the path is committed output.
    }
}
